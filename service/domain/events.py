"""The result event, built only from the stored dedup record, so that every (re)publication of
one transaction is byte-for-byte the same event with the same ``event_id``."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

import orjson

from service.domain.dedup import StoredResult
from service.domain.messages import event_id_for
from service.domain.vocabulary import Result


@functools.lru_cache(maxsize=64)  # the events of one batch share their decision time
def event_time(moment: datetime) -> str:
    """An event's ``processed_at``: UTC, to the millisecond, with a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def result_event(stored: StoredResult) -> dict[str, object]:
    approved = stored.result is Result.APPROVED
    return {
        "event_type": "PaymentAuthorized" if approved else "PaymentDeclined",
        "event_id": event_id_for(stored.transaction_id),
        "transaction_id": stored.transaction_id,
        "account_id": stored.account_id,
        "amount": stored.amount_text,
        "currency": stored.currency,
        "authorization_type": stored.authorization_type,
        "result": stored.result,
        "decline_reason": None if approved else str(stored.decline_reason),
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def encode_event(event: dict[str, object]) -> bytes:
    # Compact JSON, keys in the order above; every field is ASCII, so these bytes are the
    # ones json.dumps gave in earlier versions (a republished event stays byte-identical).
    return orjson.dumps(event)
