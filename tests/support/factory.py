"""Authorization messages as the payment network sends them."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

from service.devtools.demo import authorization_message


def auth_message(
    transaction_id: str | None = None,
    *,
    account_id: str = "ACC-1",
    amount: Any = "10.00",
    **fields: Any,
) -> dict[str, Any]:
    """An authorization request; a fresh transaction_id unless one is given."""
    txn = transaction_id or f"TXN-{uuid.uuid4().hex[:12]}"
    return authorization_message(txn, account_id=account_id, amount=amount, **fields)


def encode(message: dict[str, Any]) -> bytes:
    """JSON bytes; a Decimal amount is written as a JSON number, digits unchanged."""
    text = json.dumps(message, default=_decimal_as_number)
    return text.replace('"@@DECIMAL:', "").replace(':DECIMAL@@"', "").encode()


def _decimal_as_number(value: object) -> str:
    if isinstance(value, Decimal):
        return f"@@DECIMAL:{value}:DECIMAL@@"
    raise TypeError(f"cannot encode {type(value).__name__}")
