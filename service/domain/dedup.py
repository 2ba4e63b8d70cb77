"""Telling a batch's authorizations apart: new, duplicates or conflicts, against the dedup
records already stored and each other. Pure functions over values.

Whether a new one is approved or declined is decided in one place only, the SQL function
``payauth_decide`` (``sql/payauth_decide.sql``), which ``payauth_authorize`` calls.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from service.domain.messages import Authorization
from service.domain.vocabulary import DeclineReason, DuplicateCause, Result


@dataclass(frozen=True, slots=True)
class AppliedReversal:
    """An orphan reversal applied when its original arrived (``ReversalApplied``)."""

    transaction_id: str  # the reversal's
    amount_applied_text: str  # what it released (of a hold) or credited (of a purchase)
    correlation_id: str | None  # the reversal's


@dataclass(slots=True)  # not frozen: built once per decision, and frozen init costs 3x
class StoredResult:
    """The dedup record of a transaction already decided (by us or by another replica)."""

    transaction_id: str
    fingerprint: str
    result: Result
    decline_reason: DeclineReason | None
    account_id: str
    amount_text: str
    currency: str
    authorization_type: str
    correlation_id: str | None
    processed_at: datetime
    published: bool
    # The batch that decided it, when decided just now: its publication receipt's key.
    batch_id: UUID | None = None
    # Where the deciding message came from (None for records of earlier versions): what
    # tells a duplicate's cause.
    source_partition: int | None = None
    message_id: str | None = None
    # The lifecycle kinds (docs/lifecycle.md): what a REVERSAL or CLEARING named, and what each
    # kind applied (released, credited back, or placed as a hold), as its event says.
    original_transaction_id: str | None = None
    amount_applied_text: str | None = None
    forced: bool | None = None  # a CLEARING with no hold to end
    orphan: bool | None = None  # a REVERSAL kept until its original arrives
    # Not a decision: why the store refused a REVERSAL/CLEARING for its original
    # (LIFECYCLE_MISMATCH); nothing was stored.
    mismatch: str | None = None
    # What the decision itself changed, in the account's currency: the ledger balance and
    # what holds keep (a hold placed counts whole; the orphans its arrival applied count in
    # ``reversals_applied``). None: a purchase or refund's, read from its kind and amount.
    balance_delta_text: str | None = None
    held_delta_text: str | None = None
    reversals_applied: tuple[AppliedReversal, ...] = ()
    # An issuer's day (docs/lifecycle.md). What was approved, in the account's currency
    # (None: the amount as sent, whole), and whether that was a partial approval; the
    # account's currency when it is not the message's (a conversion: the network's
    # billing amount moved); the conversion as sent; a CLEARING's final flag; a
    # BALANCE_INQUIRY's figures as they stood at its decision; what clearings that came
    # before a hold released of it.
    amount_approved_text: str | None = None
    partial: bool = False
    account_currency: str | None = None
    billing_amount_text: str | None = None
    billing_currency: str | None = None
    final: bool | None = None
    ledger_balance_text: str | None = None
    available_balance_text: str | None = None
    already_cleared_text: str | None = None
    # A card control's decline: the card's status (CARD_BLOCKED), the limit (LIMIT_EXCEEDED).
    card_status: str | None = None
    limit_id: str | None = None


class Kind(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(slots=True)  # not frozen: built once per message, and frozen init costs 3x
class Classified:
    auth: Authorization
    kind: Kind
    # For DUPLICATE/CONFLICT: the record it repeats (stored, or earlier in the same batch).
    previous: StoredResult | None = None
    # For DUPLICATE/CONFLICT of a transaction first seen earlier in this same batch.
    first_in_batch: Authorization | None = None


def classify(
    auths: Sequence[Authorization], stored: Mapping[str, StoredResult]
) -> list[Classified]:
    """Sort a batch (in offset order) into new transactions, duplicates and conflicts.

    A key already stored is a duplicate when the payload fingerprint matches, a conflict
    otherwise. A key seen twice in the batch: the first occurrence decides, the later ones
    are duplicates or conflicts of it.
    """
    first_seen: dict[str, Authorization] = {}
    out: list[Classified] = []
    for auth in auths:
        key = auth.transaction_id
        if key in stored:
            previous = stored[key]
            kind = Kind.DUPLICATE if previous.fingerprint == auth.fingerprint else Kind.CONFLICT
            out.append(Classified(auth, kind, previous=previous))
        elif key in first_seen:
            first = first_seen[key]
            kind = Kind.DUPLICATE if first.fingerprint == auth.fingerprint else Kind.CONFLICT
            out.append(Classified(auth, kind, first_in_batch=first))
        else:
            first_seen[key] = auth
            out.append(Classified(auth, Kind.NEW))
    return out


# The fast path's value for a decided transaction: its fingerprint, then where it was
# decided from (partition and a short hash of the message_id), so that a duplicate caught
# there also tells its cause. A bare fingerprint (entries of earlier versions) still
# matches; its cause then reads as a redelivery.
def message_token(message_id: str | None) -> str:
    """8 hex digits (CRC-32) of the message_id: enough to tell two messages of one
    transaction apart, nothing of the id itself, and cheap on a replay's hot path."""
    return f"{zlib.crc32(message_id.encode()):08x}" if message_id else ""


def fast_path_value(fingerprint: str, partition: int | None, message_id: str | None) -> str:
    return f"{fingerprint}:{'' if partition is None else partition}:{message_token(message_id)}"


def read_fast_path_value(value: str) -> tuple[str, str, str]:
    """(fingerprint, partition as text or "", message token or "")."""
    fingerprint, _, rest = value.partition(":")
    partition, _, token = rest.partition(":")
    return fingerprint, partition, token


def duplicate_cause(replayed: bool, redriven: bool, partition: str, first_partition: str,
                    message_id: str | None, first_token: str) -> DuplicateCause:
    """Why this duplicate came, from what the batch already has: a replay mark above the
    offset (whatever the message, an operator's rewind is why it is read again now), a
    redrive header, the first decision's partition and message (partitions as text, ""
    when unknown; the message's token is only computed when it decides)."""
    if replayed:
        return DuplicateCause.REPLAY
    if redriven:
        return DuplicateCause.REDRIVE
    if first_partition and partition and first_partition != partition:
        return DuplicateCause.CROSS_PARTITION
    if first_token and message_id and message_token(message_id) != first_token:
        return DuplicateCause.PRODUCER_RETRY
    return DuplicateCause.REDELIVERY
