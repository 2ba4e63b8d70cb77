"""The chaos run's lifecycles: what the generator's scripts send, and what the checker's
model of the contract says a log of them implies (balances, holds, ends, ledger)."""

from __future__ import annotations

import itertools
import json
import random
from decimal import Decimal
from typing import Any

from service.devtools.chaos.checker import expired_first
from service.devtools.chaos.generator import conflict_in
from service.devtools.chaos.lifecycle_model import decided_in_order, implied_by
from service.devtools.chaos.lifecycles import Scripts
from service.domain.messages import decode_authorization

D = Decimal


class Log:
    """Log lines as the generator writes them, one partition per account, in send order."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._offset = itertools.count()

    def send(self, txn: str, kind: str, amount: str, original: str | None = None, *,
             account: str = "A", expect: str = "approved", offset: int | None = None,
             pinned: bool = False, **fields: Any) -> None:
        self.lines.append({"txn": txn, "key": account, "type": kind, "amount": amount,
                           "original": original, "expect": expect, "partition": 0,
                           "offset": next(self._offset) if offset is None else offset,
                           "pinned": pinned, "kind": "x", "fp": "f", "seq": 0, **fields})


def test_partial_reversals_are_capped_and_a_clearing_ends_the_hold_whatever_remains() -> None:
    log = Log()
    log.send("H", "AUTHORIZATION", "100.00")
    log.send("R1", "REVERSAL", "30.00", "H")
    log.send("R1", "REVERSAL", "30.00", "H")  # a redelivery: a duplicate
    log.send("C", "CLEARING", "120.00", "H")  # over the hold: posts all of it
    log.send("R2", "REVERSAL", "50.00", "H")  # after the end: nothing
    model = implied_by(log.lines)
    hold = model.holds["H"]
    assert (hold.state, hold.ended_by, hold.remaining) == ("CLEARED", "C", D(0))
    assert hold.while_active == [D("100.00"), D("70.00")]
    assert model.balance_delta == {"A": D("-120.00")}
    assert model.ledger == {"C": D("-120.00")}
    assert model.held(set()) == {}


def test_a_reversal_for_more_than_remains_releases_only_what_remains() -> None:
    log = Log()
    log.send("H", "ADVICE", "50.00")
    log.send("R1", "REVERSAL", "20.00", "H")
    log.send("R2", "REVERSAL", "50.00", "H")
    log.send("C", "CLEARING", "50.00", "H")  # after the full reversal: posts, ends nothing
    model = implied_by(log.lines)
    hold = model.holds["H"]
    assert (hold.state, hold.ended_by, hold.remaining) == ("REVERSED", "R2", D(0))
    assert model.balance_delta == {"A": D("-50.00")}


def test_an_orphan_reversal_is_applied_when_its_original_arrives() -> None:
    log = Log()
    log.send("R", "REVERSAL", "40.00", "H")  # before its original
    log.send("H", "AUTHORIZATION", "100.00")
    log.send("F", "REVERSAL", "100.00", "G")  # a full orphan
    log.send("G", "AUTHORIZATION", "100.00")
    model = implied_by(log.lines)
    assert model.holds["H"].remaining == D("60.00")
    assert model.holds["H"].state == "ACTIVE"
    assert model.held(set()) == {"A": D("60.00")}
    # reversed to nothing as it was placed: ended by no message
    assert (model.holds["G"].state, model.holds["G"].ended_by) == ("REVERSED", None)
    assert model.holds["G"].while_active == []
    assert model.orphans_waiting == 0


def test_an_expired_hold_keeps_nothing_and_a_clearing_after_it_still_posts() -> None:
    log = Log()
    log.send("H", "AUTHORIZATION", "100.00")
    log.send("C", "CLEARING", "90.00", "H")
    model = implied_by(log.lines)
    assert model.held({"H"}) == {}
    assert model.balance_delta == {"A": D("-90.00")}


def test_forced_clearings_post_and_reversals_of_declined_originals_change_nothing() -> None:
    log = Log()
    log.send("C1", "CLEARING", "10.00")
    log.send("C2", "CLEARING", "5.00", "NEVER-SENT")
    log.send("X", "AUTHORIZATION", "10.00", account="E", expect="declined")
    log.send("RX", "REVERSAL", "10.00", "X", account="E")
    log.send("O", "REVERSAL", "10.00", "Y", account="E")  # its original declined later
    log.send("Y", "AUTHORIZATION", "10.00", account="E", expect="declined")
    model = implied_by(log.lines)
    assert model.balance_delta == {"A": D("-15.00")}
    assert model.holds == {}
    assert model.orphans_waiting == 0


def test_a_purchase_is_credited_back_at_most_its_amount_orphans_too() -> None:
    log = Log()
    log.send("P", "PURCHASE", "80.00")
    log.send("R1", "REVERSAL", "50.00", "P")
    log.send("R2", "REVERSAL", "50.00", "P")
    log.send("R0", "REVERSAL", "30.00", "Q")  # before its purchase
    log.send("Q", "PURCHASE", "20.00")
    model = implied_by(log.lines)
    assert model.ledger == {"P": D("-80.00"), "R1": D("50.00"), "R2": D("30.00"),
                            "Q": D("-20.00"), "R0": D("20.00")}
    assert model.balance_delta == {"A": D("0.00")}


def test_an_issuers_day_in_the_log_moves_what_was_approved_in_the_accounts_currency(
        ) -> None:
    log = Log()
    log.send("H", "AUTHORIZATION", "100.00")
    log.send("I", "INCREMENTAL", "50.00", "H")
    log.send("C1", "CLEARING", "30.00", "H", final=False)  # a parcel: releases what it posts
    log.send("C2", "CLEARING", "110.00", "H", final=True)  # the last: releases the rest
    log.send("P", "PURCHASE", "80.00", partial=True, approved="25.00")
    log.send("J", "PURCHASE", "16000", currency="JPY", billing_amount="100.00",
             billing_currency="EUR")
    log.send("E", "CLEARING", "40.00", "F", final=False)  # before its advice
    log.send("F", "ADVICE", "100.00")
    log.send("V", "VERIFICATION", "0.00")
    model = implied_by(log.lines)
    hotel, advice = model.holds["H"], model.holds["F"]
    assert (hotel.amount, hotel.incremented, hotel.remaining, hotel.state, hotel.ended_by) \
        == (D("100.00"), D("50.00"), D(0), "CLEARED", "C2")
    assert hotel.while_active == [D("100.00"), D("150.00"), D("120.00")]
    assert (advice.remaining, advice.state) == (D("60.00"), "ACTIVE")
    assert model.ledger == {"C1": D("-30.00"), "C2": D("-110.00"), "P": D("-25.00"),
                            "J": D("-100.00"), "E": D("-40.00")}
    assert model.held(set()) == {"A": D("60.00")}
    assert model.held({"F"}) == {}


def test_the_order_is_the_partitions_and_the_first_copy_decides() -> None:
    log = Log()
    log.send("R", "REVERSAL", "10.00", "H", offset=5)
    log.send("H", "AUTHORIZATION", "10.00", offset=3)  # acknowledged later, decided first
    log.send("H", "AUTHORIZATION", "10.00", offset=1, pinned=True)  # another partition
    order = [m["txn"] for m in decided_in_order(log.lines)]
    assert order == ["H", "R"]
    model = implied_by(log.lines)
    assert (model.holds["H"].state, model.holds["H"].ended_by) == ("REVERSED", "R")


def test_scripts_send_valid_messages_for_one_account_each_in_order() -> None:
    counter = itertools.count()
    partial = [(f"PART-{i}", D("10.00") + i) for i in range(10)]
    scripts = Scripts(random.Random(7), lambda: f"CH-t-{next(counter):07d}", span=40.0,
                      orphan_purchase_reversals=True, partial=partial)
    kinds: set[str] = set()
    balances = dict(partial)
    for _ in range(600):
        planned = scripts.next("RICH", "EMPTY")
        assert len({p.account for p in planned}) == 1
        assert [p.at for p in planned] == sorted(p.at for p in planned)
        assert planned[0].at == 0.0 and all(0 <= p.at <= 40.0 for p in planned)
        for p in planned:
            body = decode_authorization(json.dumps(p.message).encode())  # raises if invalid
            kinds.add(p.kind)
            kind = body.authorization_type.value
            if p.account == "EMPTY" and kind in ("AUTHORIZATION", "INCREMENTAL", "PURCHASE"):
                assert p.expect == "declined", p  # nothing available, or no hold
            else:
                assert p.expect == "approved", p
            if p.account in balances and kind in ("PURCHASE", "AUTHORIZATION"):
                # asks more than its account holds; approved for what it holds, once
                assert body.amount > balances[p.account]
                assert p.approved == f"{balances.pop(p.account):.2f}"
                assert body.partial_ok
            elif kind != "CLEARING":
                assert p.approved is None
    assert not balances, "every account of its own used once"
    assert kinds >= {"lc_authorization", "lc_advice", "lc_reversal_partial", "lc_reversal_full",
                     "lc_reversal_over", "lc_clearing", "lc_clearing_forced",
                     "lc_clearing_late", "lc_orphan_reversal", "lc_purchase_reversal",
                     "lc_orphan_purchase_reversal", "lc_reversal_of_declined",
                     "lc_advice_past_available", "lc_clearing_after_end",
                     "lc_verification", "lc_balance_inquiry", "lc_increment",
                     "lc_increment_no_funds", "lc_increment_not_active", "lc_clearing_partial",
                     "lc_purchase_abroad", "lc_authorization_abroad", "lc_clearing_abroad",
                     "lc_reversal_abroad", "lc_clearing_early", "lc_advice_after_clearing",
                     "lc_authorization_after_clearing", "lc_partial_purchase",
                     "lc_partial_authorization", "lc_partial_purchase_whole_or_none"}


def test_without_the_flag_no_reversal_comes_before_its_purchase() -> None:
    counter = itertools.count()
    scripts = Scripts(random.Random(7), lambda: f"CH-t-{next(counter):07d}", span=40.0,
                      orphan_purchase_reversals=False)
    for _ in range(400):
        assert "lc_orphan_purchase_reversal" not in {p.kind for p in
                                                     scripts.next("RICH", "EMPTY")}


def test_only_an_increment_of_a_hold_expired_first_may_be_declined_against_the_log() -> None:
    increment = {"type": "INCREMENTAL", "original": "H"}
    declined = {"result": "DECLINED", "decline_reason": "HOLD_NOT_ACTIVE"}
    expired, active = {"H": {"state": "EXPIRED"}}, {"H": {"state": "ACTIVE"}}
    assert expired_first(increment, declined, expired)
    assert not expired_first(increment, declined, active)
    assert not expired_first(increment, {**declined, "decline_reason": "INSUFFICIENT_FUNDS"},
                             expired)
    assert not expired_first({**increment, "type": "REVERSAL"}, declined, expired)
    assert not expired_first({**increment, "original": "G"}, declined, expired)


def test_a_conflict_is_another_valid_request_under_the_same_transaction_id() -> None:
    counter = itertools.count()
    scripts = Scripts(random.Random(3), lambda: f"CH-t-{next(counter):07d}", span=40.0,
                      partial=[("PART-0", D("10.00"))])
    for _ in range(300):
        for p in scripts.next("RICH", "EMPTY"):
            first = decode_authorization(json.dumps(p.message).encode())
            other = json.loads(json.dumps(p.message))
            conflict_in(other["body"])
            second = decode_authorization(json.dumps(other).encode())  # raises if invalid
            assert second.transaction_id == first.transaction_id
            assert second.fingerprint != first.fingerprint
