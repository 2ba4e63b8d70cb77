"""Telling a batch's authorizations apart: new, duplicates or conflicts, against the dedup
records already stored and each other. Pure functions over values.

Whether a new one is approved or declined is decided in one place only, the SQL function
``payauth_authorize`` (``migrations/004_authorize_function.sql``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from service.domain.messages import Authorization
from service.domain.vocabulary import DeclineReason, Result


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
