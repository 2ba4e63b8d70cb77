"""Authorization messages as the payment network sends them."""

from __future__ import annotations

import hashlib
import json
import uuid
from decimal import Decimal
from typing import Any


def card_hash(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def auth_message(
    transaction_id: str | None = None,
    *,
    account_id: str = "ACC-1",
    amount: Any = "10.00",
    currency: str = "EUR",
    authorization_type: str = "PURCHASE",
    message_id: str | None = None,
    merchant: str = "Amazon.es",
    **body_overrides: Any,
) -> dict[str, Any]:
    txn = transaction_id or f"TXN-{uuid.uuid4().hex[:12]}"
    body: dict[str, Any] = {
        "transaction_id": txn,
        "card_number_hash": card_hash(txn),
        "account_id": account_id,
        "amount": amount,
        "currency": currency,
        "merchant": merchant,
        "merchant_category": "5411",
        "authorization_type": authorization_type,
    }
    body.update(body_overrides)
    return {
        "headers": {
            "message_id": message_id or f"msg-{uuid.uuid4().hex[:12]}",
            "correlation_id": f"corr-{txn}",
            "timestamp": "2026-04-07T14:32:15Z",
            "source": "payment-network-gateway",
        },
        "body": body,
    }


def encode(message: dict[str, Any]) -> bytes:
    """JSON bytes; a Decimal amount is written as a JSON number, digits unchanged."""
    text = json.dumps(message, default=_decimal_as_number)
    return text.replace('"@@DECIMAL:', "").replace(':DECIMAL@@"', "").encode()


def _decimal_as_number(value: object) -> str:
    if isinstance(value, Decimal):
        return f"@@DECIMAL:{value}:DECIMAL@@"
    raise TypeError(f"cannot encode {type(value).__name__}")
