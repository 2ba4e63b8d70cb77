"""An issuer's whole day through a real worker (CONTRACT.md, "An issuer's whole day"): one
test per rule, each message sent to the broker, decided by ``payauth run``, checked in the
database and on the output and dead-letter topics. Each republication is forced the way a
worker meets one (its first publication never confirmed, the fast path without it) after
what the decision read has moved, and must answer what the first did."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

from service.adapters.redis_cache import RedisDedupCache
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.workers import payauth


def _unconfirm(env: stack.Env, *txns: str) -> None:
    """As if these decisions' events were never confirmed published (a worker that died
    after publishing, before its receipt): the next copy publishes them again."""
    stack.fetch(env.dsn, "DELETE FROM published_batches WHERE batch_id IN (SELECT batch_id "
                         "FROM processed_transactions WHERE txn_id = ANY($1::text[])) "
                         "RETURNING 1", list(txns))
    stack.fetch(env.dsn, "UPDATE processed_transactions SET published_at = NULL "
                         "WHERE txn_id = ANY($1::text[]) RETURNING 1", list(txns))
    asyncio.run(_forget(env.redis_url, list(txns)))


async def _forget(url: str, txns: list[str]) -> None:
    cache = RedisDedupCache.from_url(url, ttl_seconds=86_400, timeout_seconds=2)
    try:
        await cache.forget(txns)
    finally:
        await cache.close()


def _again(message: dict[str, Any]) -> dict[str, Any]:
    """The same request, sent again by the network with a new message_id."""
    return {**message, "headers": {**message["headers"],
                                   "message_id": message["headers"]["message_id"] + "-2"}}


def _all_events(env: stack.Env, txn: str, expect: int) -> list[dict[str, Any]]:
    events = stack.events_of(stack.read_topic(env.output_topic, expect=expect))
    return [e for e in events if e["transaction_id"] == txn]


def test_verifications_check_the_account_without_funds(env, spawn_worker) -> None:
    t = lc.names("ok", "empty", "blocked", "unknown", "usd", "acc", "zero", "blk")
    lc.seed(env, (t["acc"], "100.00"), (t["zero"], "0.00"))
    asyncio.run(stack.seed_accounts(env.dsn, [(t["blk"], "10.00", "EUR")], status="BLOCKED"))
    lc.run(env, spawn_worker, [
        lc.msg(t["ok"], "VERIFICATION", t["acc"], "0.00"),
        lc.msg(t["empty"], "VERIFICATION", t["zero"], "0"),  # no funds: still approved
        lc.msg(t["blocked"], "VERIFICATION", t["blk"], "0.00"),
        lc.msg(t["unknown"], "VERIFICATION", "NOBODY-" + t["acc"], "0.00"),
        lc.msg(t["usd"], "VERIFICATION", t["acc"], "0.00", currency="USD"),
    ])
    events = lc.events(env, expect=5)
    assert {k: (events[t[k]]["result"], events[t[k]]["decline_reason"])
            for k in ("ok", "empty", "blocked", "unknown", "usd")} == {
        "ok": ("APPROVED", None), "empty": ("APPROVED", None),
        "blocked": ("DECLINED", "ACCOUNT_BLOCKED"), "unknown": ("DECLINED", "UNKNOWN_ACCOUNT"),
        "usd": ("DECLINED", "CURRENCY_MISMATCH")}
    assert events[t["ok"]]["event_type"] == "PaymentAuthorized"
    assert (events[t["ok"]]["amount_approved"], events[t["ok"]]["balance_delta"],
            events[t["ok"]]["held_delta"]) == ("0.00", "0.00", "0.00")
    assert lc.ledger(env, t["acc"]) == [] and lc.balances(env, t["acc"])[0] == Decimal("100")
    lc.verified(env)


def test_an_inquiry_redelivered_after_the_balance_moved_answers_its_first_figures(
        env, spawn_worker) -> None:
    t = lc.names("ask", "hold", "buy", "acc", "blk", "nope")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))
    asyncio.run(stack.seed_accounts(env.dsn, [(t["blk"], "10.00", "EUR")], status="BLOCKED"))
    ask = lc.msg(t["ask"], "BALANCE_INQUIRY", acc, "0.00")
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "120.00"),
        ask,
        lc.msg(t["nope"], "BALANCE_INQUIRY", t["blk"], "0.00"),
    ])
    first = lc.events(env, expect=3)[t["ask"]]
    assert (first["ledger_balance"], first["available_balance"]) == ("500.00", "380.00")
    assert lc.events(env, expect=3)[t["nope"]]["decline_reason"] == "ACCOUNT_BLOCKED"
    # The balance moves, then the network asks again (same transaction, a new message_id),
    # its first answer never confirmed published: the same figures, not today's.
    lc.send_more(env, [lc.msg(t["buy"], "PURCHASE", acc, "200.00")])
    assert lc.balances(env, acc) == (Decimal("300.00"), Decimal("120.00"), Decimal("180.00"))
    _unconfirm(env, t["ask"])
    lc.send_more(env, [_again(ask)])
    both = _all_events(env, t["ask"], expect=5)
    assert len(both) == 2 and both[0] == both[1], both
    lc.verified(env)


def test_a_partial_approval_redelivered_after_a_refund_republishes_its_first_amount(
        env, spawn_worker) -> None:
    t = lc.names("part", "whole", "refund", "hold", "acc", "acc2", "rev")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"), (t["acc2"], "50.00"))
    part = lc.msg(t["part"], "PURCHASE", acc, "150.00", partial_approval_supported=True)
    lc.run(env, spawn_worker, [
        part,
        lc.msg(t["whole"], "PURCHASE", acc, "10.00", partial_approval_supported=True),
        lc.msg(t["hold"], "AUTHORIZATION", t["acc2"], "80.00",
               partial_approval_supported=True),
        lc.msg(t["rev"], "REVERSAL", t["acc2"], "80.00", t["hold"]),
    ])
    events = lc.events(env, expect=4)
    assert (events[t["part"]]["amount_approved"], events[t["part"]]["partial"],
            events[t["part"]]["balance_delta"]) == ("100.00", True, "-100.00")
    # Nothing was left for the next one: declined, not approved for zero.
    assert events[t["whole"]]["decline_reason"] == "INSUFFICIENT_FUNDS"
    # A partial hold is the amount approved; its reversal is capped by it.
    assert (events[t["hold"]]["amount_approved"], events[t["hold"]]["held_delta"]) == \
        ("50.00", "50.00")
    assert events[t["rev"]]["amount_applied"] == "50.00"
    assert lc.ledger(env, acc) == [(t["part"], "PURCHASE", Decimal("-100.00"))]
    # A refund puts money back; the purchase comes again, its first event never confirmed:
    # the amount approved the first time, not what would fit now.
    lc.send_more(env, [lc.msg(t["refund"], "REFUND", acc, "500.00")])
    _unconfirm(env, t["part"])
    lc.send_more(env, [_again(part)])
    both = _all_events(env, t["part"], expect=6)
    assert len(both) == 2 and both[0] == both[1], both
    assert lc.ledger(env, acc) == [(t["part"], "PURCHASE", Decimal("-100.00")),
                                   (t["refund"], "REFUND", Decimal("500.00"))]
    lc.verified(env)


def test_an_increment_adds_once_to_its_active_hold(env, spawn_worker) -> None:
    t = lc.names("hotel", "inc1", "inc2", "clr", "late", "nohold", "poor", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "1000.00"))
    inc1 = lc.msg(t["inc1"], "INCREMENTAL", acc, "50.00", t["hotel"])
    lc.run(env, spawn_worker, [
        lc.msg(t["hotel"], "AUTHORIZATION", acc, "200.00"),
        inc1,
        inc1,  # the broker redelivers it
        _again(inc1),  # the network sends it again with a new message_id
        lc.msg(t["inc2"], "INCREMENTAL", acc, "30.00", t["hotel"]),
        lc.msg(t["poor"], "INCREMENTAL", acc, "5000.00", t["hotel"]),  # over the available
        lc.msg(t["nohold"], "INCREMENTAL", acc, "10.00", "NO-SUCH-HOLD"),
    ])
    hold = lc.hold(env, t["hotel"])
    assert (hold["amount"], hold["remaining"], hold["state"]) == \
        (Decimal("200.00"), Decimal("280.00"), "ACTIVE")
    assert lc.balances(env, acc) == (Decimal("1000.00"), Decimal("280.00"), Decimal("720.00"))
    events = lc.events(env, expect=6)
    assert (events[t["inc1"]]["held_delta"], events[t["inc2"]]["held_delta"]) == \
        ("50.00", "30.00")
    assert events[t["poor"]]["decline_reason"] == "INSUFFICIENT_FUNDS"
    assert events[t["nohold"]]["decline_reason"] == "HOLD_NOT_ACTIVE"
    # The final clearing ends the hold as one, of the sum; an increment after it is declined.
    lc.send_more(env, [lc.msg(t["clr"], "CLEARING", acc, "275.00", t["hotel"]),
                       lc.msg(t["late"], "INCREMENTAL", acc, "10.00", t["hotel"])])
    assert lc.hold(env, t["hotel"])["state"] == "CLEARED"
    assert lc.balances(env, acc) == (Decimal("725.00"), Decimal("0.00"), Decimal("725.00"))
    events = lc.events(env, expect=8)
    assert (events[t["clr"]]["held_delta"], events[t["clr"]]["balance_delta"]) == \
        ("-280.00", "-275.00")
    assert events[t["late"]]["decline_reason"] == "HOLD_NOT_ACTIVE"
    shown = payauth(env, "explain", t["hotel"])
    assert shown.returncode == 0 and "incremented" in shown.stdout, shown.stdout
    assert t["inc1"] in shown.stdout and t["inc2"] in shown.stdout, shown.stdout
    lc.verified(env)


def test_an_increment_of_an_expired_hold_is_declined(env, spawn_worker) -> None:
    t = lc.names("hold", "inc", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    worker = lc.run(env, spawn_worker, [lc.msg(t["hold"], "AUTHORIZATION", acc, "40.00")])
    stack.fetch(env.dsn, "UPDATE holds SET placed_at = placed_at - interval '200 hours' "
                         "RETURNING 1")
    assert payauth(env, "holds", "expire", "--execute").returncode == 0
    lc.send_more(env, [lc.msg(t["inc"], "INCREMENTAL", acc, "10.00", t["hold"])])
    events = lc.events(env, expect=3)
    assert events[t["inc"]]["decline_reason"] == "HOLD_NOT_ACTIVE"
    assert lc.balances(env, acc) == (Decimal("100.00"), Decimal("0.00"), Decimal("100.00"))
    assert worker.alive()
    lc.verified(env)


def test_a_non_final_then_a_final_clearing(env, spawn_worker) -> None:
    t = lc.names("hold", "first", "second", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "100.00"),
        lc.msg(t["first"], "CLEARING", acc, "30.00", t["hold"], final=False),
    ])
    hold = lc.hold(env, t["hold"])
    assert (hold["remaining"], hold["state"]) == (Decimal("70.00"), "ACTIVE")
    assert lc.balances(env, acc) == (Decimal("470.00"), Decimal("70.00"), Decimal("400.00"))
    lc.send_more(env, [lc.msg(t["second"], "CLEARING", acc, "65.00", t["hold"])])
    hold = lc.hold(env, t["hold"])
    assert (hold["remaining"], hold["state"], hold["ended_by"]) == (0, "CLEARED", t["second"])
    assert lc.balances(env, acc) == (Decimal("405.00"), Decimal("0.00"), Decimal("405.00"))
    events = lc.events(env, expect=3)
    assert (events[t["first"]]["final"], events[t["first"]]["held_delta"]) == (False, "-30.00")
    assert (events[t["second"]]["final"], events[t["second"]]["held_delta"]) == \
        (True, "-70.00")
    lc.verified(env)


def test_an_advice_after_its_final_clearing_holds_nothing(env, spawn_worker) -> None:
    t = lc.names("adv", "clr", "auth", "part", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["clr"], "CLEARING", acc, "50.00", t["adv"]),  # before its advice
        lc.msg(t["part"], "CLEARING", acc, "20.00", t["auth"], final=False),
    ])
    assert lc.balances(env, acc) == (Decimal("30.00"), Decimal("0"), Decimal("30.00"))
    lc.send_more(env, [lc.msg(t["adv"], "ADVICE", acc, "50.00"),
                       lc.msg(t["auth"], "AUTHORIZATION", acc, "25.00")])
    advice, auth = lc.hold(env, t["adv"]), lc.hold(env, t["auth"])
    assert (advice["remaining"], advice["state"], advice["ended_by"]) == \
        (0, "CLEARED", t["clr"])
    assert (auth["remaining"], auth["state"]) == (Decimal("5.00"), "ACTIVE")
    assert lc.balances(env, acc) == (Decimal("30.00"), Decimal("5.00"), Decimal("25.00"))
    events = lc.events(env, expect=4)
    assert events[t["clr"]]["forced"] is True
    assert (events[t["adv"]]["amount_already_cleared"], events[t["adv"]]["held_delta"]) == \
        ("50.00", "0.00")
    assert (events[t["auth"]]["amount_already_cleared"], events[t["auth"]]["held_delta"]) == \
        ("20.00", "5.00")
    lc.verified(env)


def test_a_clearing_before_the_purchase_it_names_is_voided_by_the_purchases_route(
        env, spawn_worker) -> None:
    """A clearing that names a transaction not known yet posts at once and waits; the
    original turns out to be a purchase, decided alone in a later batch (the purchases
    route): the clearing is voided, as the loop voids it beside a lifecycle message (seen
    failing: left waiting for ever, and `payauth verify` said nothing of it)."""
    t = lc.names("clr", "buy", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [lc.msg(t["clr"], "CLEARING", acc, "30.00", t["buy"])])
    lc.send_more(env, [lc.msg(t["buy"], "PURCHASE", acc, "30.00")])
    state = stack.fetch(env.dsn, "SELECT state FROM early_clearings WHERE txn_id = $1",
                        t["clr"])
    assert state[0]["state"] == "VOID"
    events = lc.events(env, expect=2)
    assert events[t["clr"]]["forced"] is True
    assert events[t["buy"]]["result"] == "APPROVED"
    # (Each posted once: the clearing when it came, the purchase as any purchase.)
    assert lc.balances(env, acc) == (Decimal("40.00"), Decimal("0"), Decimal("40.00"))
    lc.verified(env)


def test_a_purchase_abroad_moves_its_billing_amount(env, spawn_worker) -> None:
    t = lc.names("abroad", "nobill", "hold", "clr", "clr_nobill", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["abroad"], "PURCHASE", acc, "100.00", currency="USD",
               billing_amount="92.37", billing_currency="EUR"),
        lc.msg(t["nobill"], "PURCHASE", acc, "10.00", currency="USD"),
        lc.msg(t["hold"], "AUTHORIZATION", acc, "15000", currency="JPY",
               billing_amount="91.20", billing_currency="EUR"),
        lc.msg(t["clr"], "CLEARING", acc, "15100", t["hold"], currency="JPY",
               billing_amount="91.80", billing_currency="EUR"),  # the rate drifted
        lc.msg(t["clr_nobill"], "CLEARING", acc, "10.00", currency="USD"),
    ])
    assert lc.ledger(env, acc) == [(t["abroad"], "PURCHASE", Decimal("-92.37")),
                                   (t["clr"], "CLEARING", Decimal("-91.80"))]
    assert lc.balances(env, acc) == (Decimal("315.83"), Decimal("0"), Decimal("315.83"))
    events = lc.events(env, expect=4)
    abroad = events[t["abroad"]]
    assert (abroad["amount"], abroad["currency"], abroad["billing_amount"],
            abroad["billing_currency"], abroad["amount_approved"],
            abroad["balance_delta"]) == ("100.00", "USD", "92.37", "EUR", "92.37", "-92.37")
    assert events[t["nobill"]]["decline_reason"] == "CURRENCY_MISMATCH"
    assert (events[t["hold"]]["amount"], events[t["hold"]]["held_delta"]) == \
        ("15000", "91.20")
    dead = lc.dead_letters(env, expect=1)
    assert dead[0][0] == "LIFECYCLE_MISMATCH" and "billing_amount" in dead[0][1], dead
    lc.verified(env)


def test_the_new_fields_are_refused_where_they_do_not_belong(env, spawn_worker) -> None:
    t = lc.names("v", "q", "p", "f", "b", "ok", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["v"], "VERIFICATION", acc, "1.00"),  # a verification carries no amount
        lc.msg(t["q"], "PURCHASE", acc, "0.00"),  # a purchase carries one
        lc.msg(t["p"], "REFUND", acc, "5.00", partial_approval_supported=True),
        lc.msg(t["f"], "PURCHASE", acc, "5.00", final=False),
        lc.msg(t["b"], "PURCHASE", acc, "5.00", billing_amount="4.00"),  # no currency
        lc.msg(t["ok"], "PURCHASE", acc, "5.00"),
    ])
    dead = lc.dead_letters(env, expect=5)
    assert [reason for reason, _ in dead] == ["SCHEMA_VIOLATION"] * 5, dead
    details = " ".join(detail for _, detail in dead)
    for said in ("must be 0", "greater than zero", "partial_approval_supported",
                 "final is not allowed", "billing_amount and billing_currency"):
        assert said in details, (said, details)
    assert lc.events(env, expect=1)[t["ok"]]["result"] == "APPROVED"
