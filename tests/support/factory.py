"""Authorization messages as the payment network sends them."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

from service.devtools.network_message import authorization_message
from service.domain.messages import Authorization, decode_authorization


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


def authorization(txn: str, account: str, amount: str, kind: str = "PURCHASE",
                  currency: str = "EUR", original: str | None = None) -> Authorization:
    """The message as the worker decodes it, for a test that calls the store directly."""
    return decode_authorization(encode(auth_message(
        txn, account_id=account, amount=amount, currency=currency, authorization_type=kind,
        **({"original_transaction_id": original} if original else {}))))


def encode(message: dict[str, Any]) -> bytes:
    """JSON bytes; a Decimal amount is written as a JSON number, digits unchanged."""
    text = json.dumps(message, default=_decimal_as_number)
    return text.replace('"@@DECIMAL:', "").replace(':DECIMAL@@"', "").encode()


def _decimal_as_number(value: object) -> str:
    if isinstance(value, Decimal):
        return f"@@DECIMAL:{value}:DECIMAL@@"
    raise TypeError(f"cannot encode {type(value).__name__}")


def with_body_fields(account_id: str, /, **fields: Any) -> bytes:
    """A fresh authorization whose body has ``fields`` added or replaced (bad input; a field
    may replace the account_id too)."""
    message = auth_message(account_id=account_id)
    message["body"].update(fields)
    return encode(message)


def each_followed_by_a_good_one(cases: dict[str, tuple[bytes, Any]], account_id: str
                                ) -> tuple[list[tuple[bytes, bytes]], list[str]]:
    """(key, value) records: each case's bytes keyed by its name, then a good 1.00 purchase
    on ``account_id`` right behind it; and the good ones' transaction ids, in order. On one
    partition, a good one decided proves the case before it did not block the partition."""
    records: list[tuple[bytes, bytes]] = []
    good: list[str] = []
    for name, (raw, _expected) in cases.items():
        records.append((name.encode(), raw))
        txn = f"GOOD-{uuid.uuid4().hex[:10]}"
        good.append(txn)
        records.append((account_id.encode(),
                        encode(auth_message(txn, account_id=account_id, amount="1.00"))))
    return records, good
