"""What to do with each message of a batch: pure functions, no I/O, no metrics.

The runner (``pipeline.BatchProcessor``) does the I/O between these steps and hands each
step what the previous I/O returned:

    read_keys(messages)                       → a redelivery key per message, or None
    [cache lookup]
    split_fast_path(messages, keys, known, replays)
                                              → fast-path duplicates (with their cause),
                                                and the rest, with their keys
    decode_all(rest, limits, rest_keys)       → valid requests, and dead letters
    [store lookup]
    split_stored(valid, stored, replays)      → new requests, and duplicates/conflicts
    [authorize the new ones]
    decided(new, records)                     → the decisions
    in_message_order(outcomes, messages)      → one outcome per message, in order
    BatchPlan(...)                            → events, dead letters, fast-path entries,
                                                duplicate sightings

Every outcome is a value of its own type (``Decided``, ``Duplicate``, ``Conflict``,
``Invalid``), so that what a field means never depends on another field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property

from service.core.ports import Message
from service.domain.dedup import (
    Kind,
    StoredResult,
    classify,
    duplicate_cause,
    fast_path_value,
    message_token,
    read_fast_path_value,
)
from service.domain.errors import DeadLetterReason, InvalidMessage
from service.domain.messages import (
    Authorization,
    RedeliveryKey,
    decode_authorization,
    event_id_for,
    redelivery_key,
)
from service.domain.pan import redact
from service.domain.vocabulary import (
    DEFAULT_MAX_REFUND,
    DuplicateCause,
    DuplicateLayer,
    Outcome,
    Result,
)

# partition → the committed offset an operator's replay rewound from (``replay_marks``)
ReplayMarks = Mapping[int, int]


@dataclass(slots=True)  # not frozen: built once per message, and frozen init costs 3x
class Decided:
    """Decided now by this batch."""

    msg: Message
    record: StoredResult
    message_id: str

    @property
    def outcome(self) -> Outcome:
        return Outcome.APPROVED if self.record.result is Result.APPROVED else Outcome.DECLINED


@dataclass(slots=True)  # not frozen: built once per message, and frozen init costs 3x
class Duplicate:
    """A transaction decided before. ``republish``: its stored result, when its event was
    never confirmed published (the batch publishes it again, same event_id)."""

    msg: Message
    layer: DuplicateLayer
    transaction_id: str
    cause: DuplicateCause
    message_id: str | None = None  # known once validated (the fast path skips validation)
    republish: StoredResult | None = None
    fast_path: str | None = None  # the value to (re)write to the fast path once published

    outcome = Outcome.DUPLICATE


@dataclass(slots=True)  # not frozen: built once per message, and frozen init costs 3x
class Conflict:
    """The transaction_id of a decided transaction with another payload: dead-lettered, with
    what was decided and how the payloads differ, so that the operator sees at once whether
    the gateway re-used an id or the first message was wrong."""

    msg: Message
    transaction_id: str
    message_id: str
    # (field, first value, this message's value) for each key field that differs
    differences: tuple[tuple[str, str, str], ...] = ()
    stored: StoredResult | None = None  # None: the first one is earlier in this same batch

    outcome = Outcome.CONFLICT
    reason = DeadLetterReason.IDEMPOTENCY_KEY_CONFLICT

    @property
    def detail(self) -> str:
        changed = "; ".join(f"{name}: {old} -> {new}" for name, old, new in self.differences)
        return (f"transaction_id already seen with another payload ({changed}); nothing was "
                "debited")

    def headers(self) -> list[tuple[str, bytes]]:
        """The first decision and the differences, for the dead-letter record."""
        out = [("conflict.differences", "; ".join(
            f"{name}: {old} -> {new}" for name, old, new in self.differences).encode())]
        if self.stored is not None:
            s = self.stored
            out += [("conflict.stored.result", s.result.value.encode()),
                    ("conflict.stored.decline_reason", (s.decline_reason or "").encode()),
                    ("conflict.stored.account_id", s.account_id.encode()),
                    ("conflict.stored.amount", s.amount_text.encode()),
                    ("conflict.stored.currency", s.currency.encode()),
                    ("conflict.stored.authorization_type", s.authorization_type.encode()),
                    ("conflict.stored.processed_at", s.processed_at.isoformat().encode()),
                    ("conflict.stored.event_id", event_id_for(s.transaction_id).encode())]
        return out


@dataclass(slots=True)  # not frozen: built once per message, and frozen init costs 3x
class Invalid:
    """Not an authorization request (or not one the worker could process): dead-lettered."""

    msg: Message
    reason: DeadLetterReason
    detail: str
    # "database": PostgreSQL refused the row validation accepted; "processing": the worker
    # failed on it again and again (PROCESSING_FAILED)
    source: str = "validation"

    outcome = Outcome.INVALID


MessageOutcome = Decided | Duplicate | Conflict | Invalid


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 65_536
    max_refund: Decimal = DEFAULT_MAX_REFUND


def read_keys(msgs: Sequence[Message], limits: Limits) -> list[RedeliveryKey | None]:
    """Each message's key fields, read cheaply (None: the full path decides)."""
    return [redelivery_key(msg.value(), max_bytes=limits.max_message_bytes) for msg in msgs]


def split_fast_path(msgs: Sequence[Message], keys: Sequence[RedeliveryKey | None],
                    known: dict[str, str], replays: ReplayMarks
                    ) -> tuple[list[Duplicate], list[Message], list[RedeliveryKey | None]]:
    """A message whose key fields are exactly those of a transaction the fast path knows is
    a duplicate already decided and published; every other one goes on, with its key."""
    duplicates: list[Duplicate] = []
    rest: list[Message] = []
    rest_keys: list[RedeliveryKey | None] = []
    for msg, key in zip(msgs, keys, strict=True):
        value = known.get(key.transaction_id) if key is not None else None
        if key is None or value is None:
            rest.append(msg)
            rest_keys.append(key)
            continue
        fingerprint, first_partition, first_token = read_fast_path_value(value)
        if fingerprint != key.fingerprint:
            rest.append(msg)  # another payload: the store tells a conflict
            rest_keys.append(key)
            continue
        cause = _cause(msg, replays, first_partition, key.message_id, first_token)
        duplicates.append(Duplicate(msg, DuplicateLayer.REDIS, key.transaction_id, cause))
    return duplicates, rest, rest_keys


def _cause(msg: Message, replays: ReplayMarks, first_partition: str, message_id: str | None,
           first_token: str) -> DuplicateCause:
    partition = msg.partition()
    mark = replays.get(partition) if replays and partition is not None else None
    replayed = mark is not None and (msg.offset() or 0) < mark
    headers = msg.headers()
    redriven = bool(headers) and any(k == "redrive.source" for k, _ in headers or ())
    return duplicate_cause(replayed, redriven, "" if partition is None else str(partition),
                           first_partition, message_id, first_token)


def decode_all(msgs: Sequence[Message], limits: Limits,
               keys: Sequence[RedeliveryKey | None] | None = None,
               ) -> tuple[list[tuple[Message, Authorization]], list[Invalid]]:
    """Parse strictly and validate; whatever refuses a message, even a bug in decoding,
    makes it a dead letter (decoding is pure: trying again would fail the same way).
    ``keys``: each message's ``read_keys`` result (checks decoding need not repeat)."""
    valid: list[tuple[Message, Authorization]] = []
    invalid: list[Invalid] = []
    for msg, key in zip(msgs, keys if keys is not None else [None] * len(msgs), strict=True):
        try:
            valid.append((msg, decode_authorization(
                msg.value(), max_bytes=limits.max_message_bytes, max_refund=limits.max_refund,
                key=key)))
        except InvalidMessage as exc:
            invalid.append(Invalid(msg, exc.reason, exc.detail))
        except Exception as exc:
            invalid.append(Invalid(msg, DeadLetterReason.PROCESSING_FAILED,
                                   f"decoding failed: {failure_detail(exc)}"))
    return valid, invalid


def split_stored(valid: Sequence[tuple[Message, Authorization]],
                 stored: dict[str, StoredResult], replays: ReplayMarks
                 ) -> tuple[list[tuple[Message, Authorization]], list[Duplicate | Conflict]]:
    """New requests (to authorize), and the duplicates and conflicts of the dedup records
    or of an earlier message of the same batch."""
    new: list[tuple[Message, Authorization]] = []
    repeats: list[Duplicate | Conflict] = []
    first_in_batch: dict[str, Message] = {}
    classified = classify([auth for _, auth in valid], stored)
    for (msg, auth), c in zip(valid, classified, strict=True):
        if c.kind is Kind.NEW:
            new.append((msg, auth))
            first_in_batch[auth.transaction_id] = msg
        elif c.kind is Kind.DUPLICATE:
            previous = c.previous
            if previous is not None:
                first_partition, first_message_id = previous.source_partition, \
                    previous.message_id
            else:  # the first one is earlier in this batch
                first_partition = first_in_batch[auth.transaction_id].partition()
                first_message_id = c.first_in_batch.message_id if c.first_in_batch else None
            cause = _cause(msg, replays, "" if first_partition is None else str(first_partition),
                           auth.message_id, message_token(first_message_id))
            repeats.append(Duplicate(
                msg, DuplicateLayer.POSTGRES, auth.transaction_id, cause, auth.message_id,
                republish=previous if previous is not None and not previous.published else None,
                fast_path=fast_path_value(auth.fingerprint, first_partition, first_message_id)
                if previous is not None else None))
        else:
            first = c.previous if c.previous is not None else c.first_in_batch
            assert first is not None  # a conflict is always with something seen before
            repeats.append(Conflict(msg, auth.transaction_id, auth.message_id,
                                    _differences(first, auth), c.previous))
    return new, repeats


def _differences(first: StoredResult | Authorization,
                 auth: Authorization) -> tuple[tuple[str, str, str], ...]:
    """The key fields (the fingerprint's) that differ: validated values, never card data."""
    if isinstance(first, StoredResult):
        before = (first.account_id, first.amount_text, first.currency,
                  first.authorization_type)
    else:
        before = (first.account_id, first.amount_text, first.currency,
                  first.authorization_type.value)
    after = (auth.account_id, auth.amount_text, auth.currency, auth.authorization_type.value)
    names = ("account_id", "amount", "currency", "authorization_type")
    return tuple((name, old, new) for name, old, new in zip(names, before, after, strict=True)
                 if old != new)


def decided(new: Sequence[tuple[Message, Authorization]],
            records: dict[str, StoredResult]) -> list[Decided | Invalid]:
    """The decisions of the new requests (one the store refused has no record: it is
    dead-lettered by the runner instead; a REVERSAL/CLEARING whose original it cannot name
    is dead-lettered LIFECYCLE_MISMATCH, nothing stored)."""
    out: list[Decided | Invalid] = []
    for msg, auth in new:
        record = records.get(auth.transaction_id)
        if record is None:
            continue
        if record.mismatch is not None:
            out.append(Invalid(msg, DeadLetterReason.LIFECYCLE_MISMATCH,
                               f"{record.mismatch}; nothing changed", source="database"))
        else:
            out.append(Decided(msg, record, auth.message_id))
    return out


def in_message_order(outcomes: list[MessageOutcome],
                     msgs: Sequence[Message]) -> list[MessageOutcome]:
    """The outcomes in the batch's order (so events and dead letters are published in it);
    exactly one per message, or the batch fails (never an offset for a message that got no
    outcome)."""
    if _one_each_in_order(outcomes, msgs):
        return outcomes  # already so (a batch of new requests): no sort
    position = {id(msg): i for i, msg in enumerate(msgs)}
    ordered = sorted(outcomes, key=lambda o: position[id(o.msg)])
    if not _one_each_in_order(ordered, msgs):
        raise AssertionError(f"{len(outcomes)} outcome(s) for {len(msgs)} message(s)")
    return ordered


def _one_each_in_order(outcomes: Sequence[MessageOutcome], msgs: Sequence[Message]) -> bool:
    return len(outcomes) == len(msgs) and all(
        o.msg is m for o, m in zip(outcomes, msgs, strict=True))


@dataclass
class BatchPlan:
    """Every message's outcome, and what follows from them."""

    outcomes: list[MessageOutcome] = field(default_factory=list)

    @cached_property
    def events(self) -> list[tuple[StoredResult, bool]]:
        """Result events to publish: (record, is a republication), one per transaction."""
        out: dict[str, tuple[StoredResult, bool]] = {}
        for o in self.outcomes:
            if isinstance(o, Decided):
                out[o.record.transaction_id] = (o.record, False)
            elif isinstance(o, Duplicate) and o.republish is not None:
                out.setdefault(o.transaction_id, (o.republish, True))
        return list(out.values())

    def dead_letters(self) -> list[Conflict | Invalid]:
        return [o for o in self.outcomes if isinstance(o, Conflict | Invalid)]

    def fast_path_entries(self) -> dict[str, str]:
        """transaction_id → fast-path value (fingerprint and provenance), to remember once
        the events are acknowledged."""
        out: dict[str, str] = {}
        for o in self.outcomes:
            if isinstance(o, Decided):
                out[o.record.transaction_id] = fast_path_value(
                    o.record.fingerprint, o.msg.partition(), o.message_id)
            elif isinstance(o, Duplicate) and o.fast_path is not None:
                out[o.transaction_id] = o.fast_path
        return out

    def sightings(self) -> list[tuple[DuplicateCause, DuplicateLayer, int, list[str]]]:
        """The batch's duplicates as (cause, layer, partition, transaction ids): one row each
        in ``duplicate_sightings``, not one per duplicate."""
        groups: dict[tuple[DuplicateCause, DuplicateLayer, int], list[str]] = {}
        for o in self.outcomes:
            if isinstance(o, Duplicate):
                key = (o.cause, o.layer, o.msg.partition() or 0)
                groups.setdefault(key, []).append(o.transaction_id)
        return [(cause, layer, partition, ids)
                for (cause, layer, partition), ids in groups.items()]


def failure_detail(exc: BaseException) -> str:
    """The error's type and first words, masked: an error text may quote its input."""
    return redact(f"{type(exc).__name__}: {exc}")[:300]
