"""Deciding a batch of authorizations: which are new, duplicates or conflicts, and for the
new ones, approve or decline against the (locked) account balances.

Pure functions over values; the store loads the inputs and persists the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from uuid import UUID

from service.domain.messages import Authorization, AuthorizationType


class Result(StrEnum):
    APPROVED = "APPROVED"
    DECLINED = "DECLINED"


class DeclineReason(StrEnum):
    INSUFFICIENT_FUNDS = "INSUFFICIENT_FUNDS"
    UNKNOWN_ACCOUNT = "UNKNOWN_ACCOUNT"
    CURRENCY_MISMATCH = "CURRENCY_MISMATCH"
    ACCOUNT_BLOCKED = "ACCOUNT_BLOCKED"


class Outcome(StrEnum):
    """What happened to one message; the label of ``payauth_messages_total``."""

    APPROVED = "approved"
    DECLINED = "declined"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Account:
    account_id: str
    balance: Decimal
    currency: str
    status: str  # ACTIVE, BLOCKED, ...


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Decision:
    result: Result
    decline_reason: DeclineReason | None
    delta: Decimal  # signed change to the balance; 0 for a decline


def decide(auth: Authorization, account: Account | None) -> Decision:
    """Approve or decline one authorization against the account as it stands now."""
    if account is None:
        return Decision(Result.DECLINED, DeclineReason.UNKNOWN_ACCOUNT, Decimal(0))
    if account.status != "ACTIVE":
        return Decision(Result.DECLINED, DeclineReason.ACCOUNT_BLOCKED, Decimal(0))
    if account.currency != auth.currency:
        return Decision(Result.DECLINED, DeclineReason.CURRENCY_MISMATCH, Decimal(0))
    if auth.authorization_type is AuthorizationType.REFUND:
        return Decision(Result.APPROVED, None, auth.amount)
    if account.balance < auth.amount:
        return Decision(Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS, Decimal(0))
    return Decision(Result.APPROVED, None, -auth.amount)


class Kind(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
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


def decide_in_order(
    new: Sequence[Authorization], accounts: Mapping[str, Account]
) -> list[Decision]:
    """Decide new authorizations in offset order, each seeing the balance the ones before it
    left (one account's debits in a batch cannot overdraw it together)."""
    current = dict(accounts)
    decisions = []
    for auth in new:
        account = current.get(auth.account_id)
        decision = decide(auth, account)
        if account is not None and decision.delta:
            current[auth.account_id] = Account(
                account.account_id, account.balance + decision.delta, account.currency,
                account.status,
            )
        decisions.append(decision)
    return decisions
