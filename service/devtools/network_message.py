"""An authorization request as the payment network sends it (CONTRACT.md's message format),
for the demo, the chaos load, the benchmark and the tests to build their streams from."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any


def authorization_message(
    transaction_id: str,
    *,
    account_id: str,
    amount: Any,
    currency: str = "EUR",
    authorization_type: str = "PURCHASE",
    message_id: str | None = None,
    merchant: str = "Amazon.es",
    **body_overrides: Any,
) -> dict[str, Any]:
    """An authorization request as the payment network sends it (contract format)."""
    body: dict[str, Any] = {
        "transaction_id": transaction_id,
        "card_number_hash": "sha256:" + hashlib.sha256(transaction_id.encode()).hexdigest(),
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
            "message_id": message_id or f"msg-{uuid.uuid4().hex[:16]}",
            "correlation_id": f"corr-{transaction_id}",
            "timestamp": "2026-04-07T14:32:15Z",
            "source": "payment-network-gateway",
        },
        "body": body,
    }
