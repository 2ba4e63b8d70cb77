"""The plan's pure steps: typed outcomes from the batch and what the I/O returned."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.core.plan import (
    BatchPlan,
    Conflict,
    Decided,
    Duplicate,
    Invalid,
    Limits,
    decided,
    decode_all,
    in_message_order,
    read_keys,
    split_fast_path,
    split_stored,
)
from service.domain.dedup import StoredResult
from service.domain.errors import DeadLetterReason
from service.domain.messages import decode_authorization
from service.domain.vocabulary import Outcome, Result
from tests.support.factory import auth_message, encode
from tests.unit.test_pipeline import Msg


def stored(raw: bytes, *, published: bool) -> StoredResult:
    a = decode_authorization(raw)
    return StoredResult(a.transaction_id, a.fingerprint, Result.APPROVED, None, a.account_id,
                        a.amount_text, a.currency, a.authorization_type.value, None,
                        datetime.now(UTC), published)


def test_each_message_gets_one_typed_outcome_and_the_plan_follows() -> None:
    fast, old, new, clash = (encode(auth_message(t)) for t in ("F", "O", "N", "C"))
    clash_other = encode(auth_message("C", amount="99.00"))
    batch = [Msg(raw, i) for i, raw in enumerate([fast, old, new, b"not json", clash_other])]
    limits = Limits()
    keys = read_keys(batch, limits)
    fast_dups, rest, rest_keys = split_fast_path(
        batch, keys, {"F": decode_authorization(fast).fingerprint}, {})
    assert [d.transaction_id for d in fast_dups] == ["F"] and fast_dups[0].layer == "redis"
    valid, invalid = decode_all(rest, limits, rest_keys)
    assert [a for _, a in valid] == [a for _, a in decode_all(rest, limits)[0]]  # key or not
    assert [i.msg.off for i in invalid] == [3] and invalid[0].outcome is Outcome.INVALID
    records = {"O": stored(old, published=False), "C": stored(clash, published=True)}
    fresh, repeats = split_stored(valid, records, {})
    assert [a.transaction_id for _, a in fresh] == ["N"]
    duplicate, conflict = repeats
    assert isinstance(duplicate, Duplicate) and duplicate.republish == records["O"]
    assert isinstance(conflict, Conflict) and conflict.transaction_id == "C"
    now = decided(fresh, {"N": stored(new, published=False)})
    assert isinstance(now[0], Decided) and now[0].outcome is Outcome.APPROVED

    plan = BatchPlan([*fast_dups, *invalid, *now, *repeats])
    assert [(r.transaction_id, again) for r, again in plan.events] == [("N", False),
                                                                          ("O", True)]
    assert {type(d) for d in plan.dead_letters()} == {Invalid, Conflict}
    assert set(plan.fast_path_entries()) == {"N", "O"}, "never a conflict, never before commit"


class Sent(Msg):
    """A message with the partition, offset and headers the test gives it."""

    def __init__(self, raw: bytes, off: int, partition: int = 0,
                 headers: list[tuple[str, bytes]] | None = None) -> None:
        super().__init__(raw, off)
        self._partition, self._headers = partition, headers

    def partition(self) -> int:
        return self._partition

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def test_duplicate_causes_from_what_the_batch_already_has() -> None:
    from service.domain.dedup import fast_path_value
    from service.domain.vocabulary import DuplicateCause as C

    def sent(message_id: str, **where: object) -> Sent:
        return Sent(encode(auth_message("T", message_id=message_id)), **where)  # type: ignore[arg-type]

    first = decode_authorization(encode(auth_message("T", message_id="m-1")))
    known = {"T": fast_path_value(first.fingerprint, 0, "m-1")}
    redriven = [("redrive.source", b"dlq/0/7")]
    batch = [sent("m-1", off=10), sent("m-2", off=11), sent("m-1", off=12, partition=3),
             sent("m-3", off=13, headers=redriven),
             sent("m-1", off=4, headers=redriven)]  # below the replay mark: a replay first
    dups, rest, _ = split_fast_path(batch, read_keys(batch, Limits()), known, {0: 5})
    assert rest == []
    assert [d.cause for d in dups] == [C.REDELIVERY, C.PRODUCER_RETRY, C.CROSS_PARTITION,
                                       C.REDRIVE, C.REPLAY]
    # An entry written by an earlier version (a bare fingerprint) still matches.
    old, _, _ = split_fast_path(batch[:1], read_keys(batch[:1], Limits()),
                             {"T": first.fingerprint}, {})
    assert [d.cause for d in old] == [C.REDELIVERY]
    # The plan sums them up per batch: one sighting row per cause, layer and partition.
    rows = BatchPlan(list(dups)).sightings()
    assert sorted((c.value, p, ids) for c, _layer, p, ids in rows) == [
        ("cross_partition", 3, ["T"]), ("producer_retry", 0, ["T"]), ("redelivery", 0, ["T"]),
        ("redrive", 0, ["T"]), ("replay", 0, ["T"])]


def test_outcomes_come_back_in_the_batch_order_one_per_message() -> None:
    batch = [Msg(encode(auth_message(f"T{i}")), i) for i in range(4)]
    outcomes = [Invalid(m, DeadLetterReason.INVALID_JSON, "x") for m in batch]
    assert in_message_order(outcomes, batch) == outcomes  # in order already
    shuffled = [outcomes[2], outcomes[0], outcomes[3], outcomes[1]]
    assert in_message_order(shuffled, batch) == outcomes
    with pytest.raises(AssertionError):  # a message without an outcome
        in_message_order(outcomes[:3], batch)
    with pytest.raises(AssertionError):  # as many outcomes as messages, one of them twice
        in_message_order([outcomes[0], outcomes[1], outcomes[1], outcomes[3]], batch)
