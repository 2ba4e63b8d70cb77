"""The result event, built only from the stored dedup record, so that every (re)publication of
one transaction is byte-for-byte the same event with the same ``event_id``."""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime

import orjson

from service.domain.dedup import StoredResult
from service.domain.messages import event_id_for
from service.domain.vocabulary import AuthorizationType, Result

# HoldExpired's event_id: stable per hold, apart from the hold's own PaymentAuthorized.
_EXPIRY_NAMESPACE = uuid.UUID("0d7e3f52-64b4-4c1b-8a2e-51f6a1c0e7d3")


@functools.lru_cache(maxsize=64)  # the events of one batch share their decision time
def event_time(moment: datetime) -> str:
    """An event's ``processed_at``: UTC, to the millisecond, with a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def result_event(stored: StoredResult) -> dict[str, object]:
    kind = stored.authorization_type
    if kind == AuthorizationType.REVERSAL:
        return _reversed_event(stored)
    if kind == AuthorizationType.CLEARING and stored.result is Result.APPROVED:
        return _cleared_event(stored)
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


def _reversed_event(stored: StoredResult) -> dict[str, object]:
    """A REVERSAL, never declined: what it released (or credited back) is amount_applied;
    ``waiting_for_original``: kept until its original arrives (nothing applied yet)."""
    return {
        "event_type": "PaymentReversed",
        "event_id": event_id_for(stored.transaction_id),
        "transaction_id": stored.transaction_id,
        "original_transaction_id": stored.original_transaction_id,
        "account_id": stored.account_id,
        "amount": stored.amount_text,
        "amount_applied": stored.amount_applied_text,
        "currency": stored.currency,
        "authorization_type": stored.authorization_type,
        "result": stored.result,
        "waiting_for_original": bool(stored.orphan),
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def _cleared_event(stored: StoredResult) -> dict[str, object]:
    """A CLEARING posted: ``forced`` when there was no hold to end (no original named, or
    none known as a hold); the contract has original_transaction_id null then."""
    return {
        "event_type": "PaymentCleared",
        "event_id": event_id_for(stored.transaction_id),
        "transaction_id": stored.transaction_id,
        "original_transaction_id": None if stored.forced else stored.original_transaction_id,
        "account_id": stored.account_id,
        "amount": stored.amount_text,
        "amount_released": stored.amount_applied_text,
        "forced": bool(stored.forced),
        "currency": stored.currency,
        "authorization_type": stored.authorization_type,
        "result": stored.result,
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def hold_expired_event(transaction_id: str, account_id: str, currency: str,
                       amount_released: str, correlation_id: str | None,
                       ended_at: datetime) -> dict[str, object]:
    """A hold ended by ``payauth holds expire``: built from the hold's row only, so that a
    republication (the run after a failed publish) is the same event."""
    return {
        "event_type": "HoldExpired",
        "event_id": str(uuid.uuid5(_EXPIRY_NAMESPACE, transaction_id)),
        "transaction_id": transaction_id,
        "account_id": account_id,
        "amount_released": amount_released,
        "currency": currency,
        "result": Result.APPROVED,
        "correlation_id": correlation_id,
        "processed_at": event_time(ended_at),
    }


def encode_event(event: dict[str, object]) -> bytes:
    # Compact JSON, keys in the order above; every field is ASCII, so these bytes are the
    # ones json.dumps gave in earlier versions (a republished event stays byte-identical).
    return orjson.dumps(event)
