"""The result events, built only from the stored dedup record, so that every (re)publication of
one transaction is byte-for-byte the same events with the same ``event_id``s.

Every event says what it changed (CONTRACT.md, "Every change in an event"): ``balance_delta``
(the ledger balance) and ``held_delta`` (what holds keep), signed, in the account's currency
and its minor unit, "0.00" for a decline or a kind that changes nothing. A consumer that
counts each ``event_id`` once rebuilds every balance and held amount from them alone: a
decision's own event carries its own effect, each orphan reversal its arrival applied has a
``ReversalApplied`` of its own, and an expiry's ``HoldExpired`` the hold it released."""

from __future__ import annotations

import functools
import uuid
from datetime import UTC, datetime

import orjson

from service.domain.dedup import AppliedReversal, StoredResult
from service.domain.messages import event_id_for
from service.domain.money import quantum
from service.domain.vocabulary import AuthorizationType, Result

# HoldExpired's event_id: stable per hold, apart from the hold's own PaymentAuthorized.
_EXPIRY_NAMESPACE = uuid.UUID("0d7e3f52-64b4-4c1b-8a2e-51f6a1c0e7d3")
# ReversalApplied's: stable per reversal (a reversal is applied at most once), apart from
# the reversal's own PaymentReversed.
_APPLIED_NAMESPACE = uuid.UUID("b3f0c2a4-5e61-4d8f-9c27-8a1d6e4f0b95")


@functools.lru_cache(maxsize=64)  # the events of one batch share their decision time
def event_time(moment: datetime) -> str:
    """An event's ``processed_at``: UTC, to the millisecond, with a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@functools.cache  # a few dozen currencies
def zero(currency: str) -> str:
    """"0.00", "0": no change, in the currency's minor unit."""
    return str(quantum(currency) * 0)


def approved_amount(stored: StoredResult) -> str:
    """What a decision approved, in the account's currency: as the store answered when it
    is not the amount as sent (a partial approval, a conversion), else the amount."""
    return stored.amount_approved_text if stored.amount_approved_text is not None \
        else stored.amount_text


def deltas(stored: StoredResult) -> tuple[str, str]:
    """(balance_delta, held_delta) of the decision itself, in the account's currency: as the
    store answered for the lifecycle kinds; a purchase's or refund's from its kind and what
    was approved (a verification's and an inquiry's: nothing)."""
    if stored.balance_delta_text is not None and stored.held_delta_text is not None:
        return stored.balance_delta_text, stored.held_delta_text
    nothing = zero(stored.account_currency or stored.currency)
    if stored.result is not Result.APPROVED:
        return nothing, nothing
    if stored.authorization_type == AuthorizationType.PURCHASE:
        return "-" + approved_amount(stored), nothing
    if stored.authorization_type == AuthorizationType.REFUND:
        return approved_amount(stored), nothing
    return nothing, nothing  # a VERIFICATION, a BALANCE_INQUIRY


def _issuers_day(stored: StoredResult, event: dict[str, object]) -> dict[str, object]:
    """The fields of an issuer's day an event carries beside the contract's first ones:
    what was approved (every decision; null for a decline), the conversion as sent, an
    inquiry's figures, what clearings before a hold released of it; and what names a card
    control's decline (``card_status`` of a CARD_BLOCKED, ``limit_id`` of a
    LIMIT_EXCEEDED)."""
    approved = stored.result is Result.APPROVED
    event["amount_approved"] = approved_amount(stored) if approved else None
    event["partial"] = stored.partial
    if stored.billing_currency is not None:
        event["billing_amount"] = stored.billing_amount_text
        event["billing_currency"] = stored.billing_currency
    if stored.ledger_balance_text is not None:
        event["ledger_balance"] = stored.ledger_balance_text
        event["available_balance"] = stored.available_balance_text
    if stored.already_cleared_text is not None:
        event["amount_already_cleared"] = stored.already_cleared_text
    if stored.card_status is not None:
        event["card_status"] = stored.card_status
    if stored.limit_id is not None:
        event["limit_id"] = stored.limit_id
    return event


def events_of(stored: StoredResult) -> list[dict[str, object]]:
    """Every event of one decision: its own, then a ``ReversalApplied`` for each orphan
    reversal its arrival applied, in the order they were applied."""
    own = result_event(stored)
    if not stored.reversals_applied:
        return [own]
    return [own, *(reversal_applied_event(stored, r) for r in stored.reversals_applied)]


def result_event(stored: StoredResult) -> dict[str, object]:
    kind = stored.authorization_type
    if kind == AuthorizationType.REVERSAL:
        return _reversed_event(stored)
    if kind == AuthorizationType.CLEARING and stored.result is Result.APPROVED:
        return _cleared_event(stored)
    approved = stored.result is Result.APPROVED
    balance_delta, held_delta = deltas(stored)
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
        "balance_delta": balance_delta,
        "held_delta": held_delta,
        **_issuers_day(stored, {}),
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def _reversed_event(stored: StoredResult) -> dict[str, object]:
    """A REVERSAL, never declined: what it released (or credited back) is amount_applied;
    ``waiting_for_original``: kept until its original arrives (nothing applied yet; what it
    applies then comes as a ``ReversalApplied``)."""
    balance_delta, held_delta = deltas(stored)
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
        "balance_delta": balance_delta,
        "held_delta": held_delta,
        **_issuers_day(stored, {}),
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def _cleared_event(stored: StoredResult) -> dict[str, object]:
    """A CLEARING posted: ``forced`` when there was no hold to end (no original named, or
    none known as a hold); the contract has original_transaction_id null then."""
    balance_delta, held_delta = deltas(stored)
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
        "final": stored.final is not False,
        "balance_delta": balance_delta,
        "held_delta": held_delta,
        **_issuers_day(stored, {}),
        "correlation_id": stored.correlation_id,
        "processed_at": event_time(stored.processed_at),
    }


def reversal_applied_event(original: StoredResult,
                           applied: AppliedReversal) -> dict[str, object]:
    """An orphan reversal applied when its ``original`` arrived, published with the
    original's own event (built from the original's record and the reversal's, so that a
    republication is the same event): released from the hold the original placed, or
    credited back to the purchase."""
    amount = applied.amount_applied_text
    nothing = zero(original.account_currency or original.currency)
    credit = original.authorization_type == AuthorizationType.PURCHASE
    released = nothing if amount == nothing else "-" + amount
    return {
        "event_type": "ReversalApplied",
        "event_id": str(uuid.uuid5(_APPLIED_NAMESPACE, applied.transaction_id)),
        "transaction_id": applied.transaction_id,
        "original_transaction_id": original.transaction_id,
        "account_id": original.account_id,
        "amount_applied": amount,
        "currency": original.account_currency or original.currency,
        "authorization_type": AuthorizationType.REVERSAL,
        "result": Result.APPROVED,
        "balance_delta": amount if credit else nothing,
        "held_delta": nothing if credit else released,
        "correlation_id": applied.correlation_id,
        "processed_at": event_time(original.processed_at),
    }


def hold_expired_event(transaction_id: str, account_id: str, currency: str,
                       amount_released: str, correlation_id: str | None,
                       ended_at: datetime) -> dict[str, object]:
    """A hold ended by ``payauth holds expire``: built from the hold's row only, so that a
    republication (the run after a failed publish) is the same event."""
    nothing = zero(currency)
    return {
        "event_type": "HoldExpired",
        "event_id": str(uuid.uuid5(_EXPIRY_NAMESPACE, transaction_id)),
        "transaction_id": transaction_id,
        "account_id": account_id,
        "amount_released": amount_released,
        "currency": currency,
        "result": Result.APPROVED,
        "balance_delta": nothing,
        "held_delta": nothing if amount_released == nothing else "-" + amount_released,
        "correlation_id": correlation_id,
        "processed_at": event_time(ended_at),
    }


def encode_event(event: dict[str, object]) -> bytes:
    # Compact JSON, keys in the order above; every field is ASCII, so these bytes are the
    # ones json.dumps gave in earlier versions (a republished event stays byte-identical).
    return orjson.dumps(event)
