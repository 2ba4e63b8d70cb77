"""The plan's pure steps: typed outcomes from the batch and what the I/O returned."""

from __future__ import annotations

from datetime import UTC, datetime

from service.domain.dedup import StoredResult
from service.domain.messages import decode_authorization
from service.domain.vocabulary import Outcome, Result
from service.plan import (
    BatchPlan,
    Conflict,
    Decided,
    Duplicate,
    Invalid,
    Limits,
    decided,
    decode_all,
    read_keys,
    split_fast_path,
    split_stored,
)
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
    fast_dups, rest = split_fast_path(batch, keys, {"F": decode_authorization(fast).fingerprint})
    assert [d.transaction_id for d in fast_dups] == ["F"] and fast_dups[0].layer == "redis"
    valid, invalid = decode_all(rest, limits)
    assert [i.msg.off for i in invalid] == [3] and invalid[0].outcome is Outcome.INVALID
    records = {"O": stored(old, published=False), "C": stored(clash, published=True)}
    fresh, repeats = split_stored(valid, records)
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
