"""The authorization lifecycle through a real worker (CONTRACT.md, "Authorization lifecycle"):
one test per rule, each message sent to the broker, decided by ``payauth run``, checked in
the database (holds, ledger, the balances view) and on the output and dead-letter topics."""

from __future__ import annotations

import asyncio
import re
from decimal import Decimal

from service.adapters.redis_cache import RedisDedupCache
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.workers import payauth


def test_partial_reversals_never_release_more_than_remains(env, spawn_worker) -> None:
    t = lc.names("hold", "r1", "r2", "r3", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))
    r1 = lc.msg(t["r1"], "REVERSAL", acc, "60.00", t["hold"])
    worker = lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "100.00"),
        r1,
        r1,  # redelivered
        {**r1, "headers": {**r1["headers"], "message_id": "msg-retry-r1"}},  # sent again
        lc.msg(t["r2"], "REVERSAL", acc, "60.00", t["hold"]),  # only 40 remain
        lc.msg(t["r3"], "REVERSAL", acc, "5.00", t["hold"]),  # after the hold ended
    ])
    assert lc.balances(env, acc) == (Decimal("500.00"), 0, Decimal("500.00"))
    hold = lc.hold(env, t["hold"])
    assert (hold["remaining"], hold["state"], hold["ended_by"]) == (0, "REVERSED", t["r2"])
    events = lc.events(env, expect=4)
    assert events[t["hold"]]["event_type"] == "PaymentAuthorized"
    applied = {k: (events[t[k]]["event_type"], events[t[k]]["amount"],
                   events[t[k]]["amount_applied"], events[t[k]]["result"])
               for k in ("r1", "r2", "r3")}
    assert applied == {"r1": ("PaymentReversed", "60.00", "60.00", "APPROVED"),
                       "r2": ("PaymentReversed", "60.00", "40.00", "APPROVED"),
                       "r3": ("PaymentReversed", "5.00", "0.00", "APPROVED")}
    lc.verified(env)
    assert events[t["r1"]]["original_transaction_id"] == t["hold"]
    assert lc.ledger(env, acc) == []  # holds and their releases never write the ledger
    m = worker.metrics()
    assert m['payauth_messages_total{outcome="duplicate"}'] == 2
    results = stack.fetch(env.dsn, "SELECT DISTINCT result FROM processed_transactions")
    assert [r["result"] for r in results] == ["APPROVED"]


def test_an_orphan_reversal_is_applied_when_its_original_arrives(env, spawn_worker) -> None:
    t = lc.names("full", "rfull", "part", "rpart", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["rfull"], "REVERSAL", acc, "100.00", t["full"]),  # before its original
        lc.msg(t["rpart"], "REVERSAL", acc, "30.00", t["part"]),
        lc.msg(t["full"], "AUTHORIZATION", acc, "100.00"),
        lc.msg(t["part"], "AUTHORIZATION", acc, "100.00"),
    ])
    assert lc.hold(env, t["full"])["state"] == "REVERSED"  # a full reversal: nothing held
    assert lc.hold(env, t["full"])["remaining"] == 0
    part = lc.hold(env, t["part"])
    assert (part["remaining"], part["state"]) == (Decimal("70.00"), "ACTIVE")
    assert lc.balances(env, acc) == (Decimal("500.00"), Decimal("70.00"), Decimal("430.00"))
    orphans = stack.fetch(env.dsn, "SELECT txn_id, state, applied FROM orphan_reversals")
    assert {r["txn_id"]: (r["state"], r["applied"]) for r in orphans} == {
        t["rfull"]: ("APPLIED", Decimal("100.00")), t["rpart"]: ("APPLIED", Decimal("30.00"))}
    events = lc.events(env, expect=6)
    assert events[t["rfull"]]["waiting_for_original"] is True
    assert events[t["rfull"]]["amount_applied"] == "0.00"  # nothing yet when it came
    assert (events[t["rfull"]]["balance_delta"], events[t["rfull"]]["held_delta"]) == \
        ("0.00", "0.00")
    # Each applied when its original came, in an event of its own; the original's event
    # carries only the hold it placed.
    assert events[t["full"]]["held_delta"] == "100.00"
    for reversal, original, amount in ((t["rfull"], t["full"], "100.00"),
                                       (t["rpart"], t["part"], "30.00")):
        event = events[lc.applied(reversal)]
        assert (event["original_transaction_id"], event["amount_applied"],
                event["held_delta"], event["balance_delta"]) == (original, amount,
                                                                 f"-{amount}", "0.00")


def test_clearings_over_under_forced_after_a_reversal(env, spawn_worker) -> None:
    t = lc.names("h1", "c1", "h2", "c2", "c3", "c4", "h3", "r3", "c5", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["h1"], "AUTHORIZATION", acc, "50.00"),
        lc.msg(t["c1"], "CLEARING", acc, "60.00", t["h1"]),  # over the hold (a tip)
        lc.msg(t["h2"], "AUTHORIZATION", acc, "30.00"),
        lc.msg(t["c2"], "CLEARING", acc, "20.00", t["h2"]),  # under
        lc.msg(t["c3"], "CLEARING", acc, "5.00"),  # forced: no original
        lc.msg(t["c4"], "CLEARING", acc, "5.00", "NO-SUCH-HOLD"),  # forced: no such hold
        lc.msg(t["h3"], "AUTHORIZATION", acc, "10.00"),
        lc.msg(t["r3"], "REVERSAL", acc, "10.00", t["h3"]),
        lc.msg(t["c5"], "CLEARING", acc, "10.00", t["h3"]),  # after a full reversal: posts
    ])
    assert lc.balances(env, acc) == (Decimal("0.00"), 0, Decimal("0.00"))
    assert [(lc.hold(env, t[h])["state"], lc.hold(env, t[h])["released"])
            for h in ("h1", "h2", "h3")] == [("CLEARED", Decimal("50.00")),
                                             ("CLEARED", Decimal("30.00")),
                                             ("REVERSED", Decimal("10.00"))]
    assert lc.ledger(env, acc) == [(t["c1"], "CLEARING", Decimal("-60.00")),
                                 (t["c2"], "CLEARING", Decimal("-20.00")),
                                 (t["c3"], "CLEARING", Decimal("-5.00")),
                                 (t["c4"], "CLEARING", Decimal("-5.00")),
                                 (t["c5"], "CLEARING", Decimal("-10.00"))]
    events = lc.events(env, expect=9)
    cleared = {k: (events[t[k]]["event_type"], events[t[k]]["original_transaction_id"],
                   events[t[k]]["amount"], events[t[k]]["forced"])
               for k in ("c1", "c2", "c3", "c4", "c5")}
    assert cleared == {"c1": ("PaymentCleared", t["h1"], "60.00", False),
                       "c2": ("PaymentCleared", t["h2"], "20.00", False),
                       "c3": ("PaymentCleared", None, "5.00", True),
                       "c4": ("PaymentCleared", None, "5.00", True),
                       "c5": ("PaymentCleared", t["h3"], "10.00", False)}
    lc.verified(env)


def test_a_clearing_takes_the_balance_below_zero(env, spawn_worker) -> None:
    t = lc.names("h", "c", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "10.00"))
    lc.run(env, spawn_worker, [lc.msg(t["h"], "AUTHORIZATION", acc, "10.00"),
                             lc.msg(t["c"], "CLEARING", acc, "25.00", t["h"])])
    assert lc.balances(env, acc) == (Decimal("-15.00"), 0, Decimal("-15.00"))
    lc.verified(env)


def test_an_advice_is_placed_past_the_available_balance(env, spawn_worker) -> None:
    t = lc.names("adv", "auth", "buy", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "50.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["adv"], "ADVICE", acc, "80.00"),
        lc.msg(t["auth"], "AUTHORIZATION", acc, "1.00"),  # against the available balance
        lc.msg(t["buy"], "PURCHASE", acc, "1.00"),  # so is a purchase
    ])
    assert lc.balances(env, acc) == (Decimal("50.00"), Decimal("80.00"), Decimal("-30.00"))
    events = lc.events(env, expect=3)
    assert (events[t["adv"]]["event_type"], events[t["adv"]]["authorization_type"]) == \
        ("PaymentAuthorized", "ADVICE")
    assert [events[t[k]]["decline_reason"] for k in ("auth", "buy")] == \
        ["INSUFFICIENT_FUNDS", "INSUFFICIENT_FUNDS"]
    lc.verified(env)


def test_purchases_are_decided_against_the_available_balance(env, spawn_worker) -> None:
    t = lc.names("hold", "buy", "small", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    worker = lc.run(env, spawn_worker, [lc.msg(t["hold"], "AUTHORIZATION", acc, "80.00")])
    # A batch of purchases only: the purchase path (payauth_authorize) reads held too.
    lc.send_more(env, [lc.msg(t["buy"], "PURCHASE", acc, "30.00"),
                     lc.msg(t["small"], "PURCHASE", acc, "20.00")])
    events = lc.events(env, expect=3)
    assert events[t["buy"]]["decline_reason"] == "INSUFFICIENT_FUNDS"
    assert events[t["small"]]["result"] == "APPROVED"
    assert lc.balances(env, acc) == (Decimal("80.00"), Decimal("80.00"), Decimal("0.00"))
    assert worker.alive()


def test_a_reversal_of_a_declined_authorization_changes_nothing(env, spawn_worker) -> None:
    t = lc.names("auth", "rev", "orph", "late", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "50.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["orph"], "REVERSAL", acc, "10.00", t["late"]),  # its original is declined
        lc.msg(t["auth"], "AUTHORIZATION", acc, "1000.00"),
        lc.msg(t["rev"], "REVERSAL", acc, "1000.00", t["auth"]),
        lc.msg(t["late"], "AUTHORIZATION", acc, "1000.00"),
    ])
    assert lc.balances(env, acc) == (Decimal("50.00"), 0, Decimal("50.00"))
    assert lc.ledger(env, acc) == []
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds")[0]["n"] == 0
    events = lc.events(env, expect=4)
    assert (events[t["rev"]]["result"], events[t["rev"]]["amount_applied"]) == \
        ("APPROVED", "0.00")
    orphan = stack.fetch(env.dsn, "SELECT state FROM orphan_reversals")
    assert [r["state"] for r in orphan] == ["VOID"]


def test_a_reversal_of_a_purchase_credits_back_what_is_not_yet_reversed(env,
                                                                       spawn_worker) -> None:
    t = lc.names("buy", "r1", "r2", "r3", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["buy"], "PURCHASE", acc, "70.00"),
        lc.msg(t["r1"], "REVERSAL", acc, "50.00", t["buy"]),
        lc.msg(t["r2"], "REVERSAL", acc, "50.00", t["buy"]),  # 20 left to credit
        lc.msg(t["r3"], "REVERSAL", acc, "50.00", t["buy"]),  # nothing left
    ])
    assert lc.balances(env, acc) == (Decimal("100.00"), 0, Decimal("100.00"))
    assert lc.ledger(env, acc) == [(t["buy"], "PURCHASE", Decimal("-70.00")),
                                 (t["r1"], "REVERSAL", Decimal("50.00")),
                                 (t["r2"], "REVERSAL", Decimal("20.00"))]
    events = lc.events(env, expect=4)
    assert [events[t[k]]["amount_applied"] for k in ("r1", "r2", "r3")] == \
        ["50.00", "20.00", "0.00"]
    lc.verified(env)


def test_mismatched_originals_are_dead_lettered_and_change_nothing(env, spawn_worker) -> None:
    t = lc.names("hold", "other", "refund", "buy", "m1", "m2", "m3", "m4", "m5", "acc", "acc2")
    acc, acc2 = t["acc"], t["acc2"]
    lc.seed(env, (acc, "100.00"), (acc2, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "40.00"),
        lc.msg(t["refund"], "REFUND", acc, "5.00"),
        lc.msg(t["buy"], "PURCHASE", acc, "5.00"),
        lc.msg(t["m2"], "REVERSAL", acc, "10.00", t["hold"], currency="USD"),  # currency
        lc.msg(t["m3"], "REVERSAL", acc, "1.00", t["refund"]),  # names a REFUND
        lc.msg(t["m4"], "CLEARING", acc, "1.00", t["buy"]),  # a clearing of a purchase
    ])
    # Another account's messages come on another partition, in no order with these: sent
    # once the originals are decided.
    lc.send_more(env, [lc.msg(t["m1"], "REVERSAL", acc2, "10.00", t["hold"]),
                     lc.msg(t["m5"], "CLEARING", acc2, "10.00", t["hold"])])
    letters = lc.dead_letters(env, expect=5)
    assert [reason for reason, _ in letters] == ["LIFECYCLE_MISMATCH"] * 5
    assert any("another account" in detail for _, detail in letters)
    assert lc.balances(env, acc) == (Decimal("100.00"), Decimal("40.00"), Decimal("60.00"))
    assert lc.balances(env, acc2) == (Decimal("100.00"), 0, Decimal("100.00"))
    decided = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")
    assert {r["txn_id"] for r in decided} == {t["hold"], t["refund"], t["buy"]}


def test_a_conflicting_body_is_a_conflict(env, spawn_worker) -> None:
    t = lc.names("hold", "rev", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "40.00"),
        lc.msg(t["rev"], "REVERSAL", acc, "10.00", t["hold"]),
        lc.msg(t["rev"], "REVERSAL", acc, "10.00", "ANOTHER-ORIGINAL"),
        lc.msg(t["rev"], "REVERSAL", acc, "11.00", t["hold"]),
    ])
    assert [r for r, _ in lc.dead_letters(env, expect=2)] == ["IDEMPOTENCY_KEY_CONFLICT"] * 2
    assert lc.balances(env, acc) == (Decimal("100.00"), Decimal("30.00"), Decimal("70.00"))


async def _forget(url: str, txn_ids: list[str]) -> None:
    cache = RedisDedupCache.from_url(url, ttl_seconds=86_400, timeout_seconds=2)
    try:
        await cache.forget(txn_ids)
    finally:
        await cache.close()


def test_a_redelivery_after_the_dedup_purge_changes_nothing(env, spawn_worker) -> None:
    t = lc.names("hold", "adv", "rev", "clr", "declined", "orph", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    messages = [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "60.00"),
        lc.msg(t["adv"], "ADVICE", acc, "10.00"),
        lc.msg(t["rev"], "REVERSAL", acc, "20.00", t["hold"]),
        lc.msg(t["clr"], "CLEARING", acc, "5.00", t["adv"]),
        lc.msg(t["declined"], "AUTHORIZATION", acc, "1000.00"),
        lc.msg(t["orph"], "REVERSAL", acc, "1.00", "NOT-YET"),
    ]
    worker = lc.run(env, spawn_worker, messages)
    before = (lc.balances(env, acc), lc.ledger(env, acc), lc.hold(env, t["hold"]))
    # The retention passes (decided 100 h ago), `payauth purge` runs, the fast path forgets.
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = processed_at - interval '100 hours'")
    purged = payauth(env, "purge")
    assert purged.returncode == 0, purged.stderr
    assert f"deleted {len(messages)} dedup record(s)" in purged.stdout, purged.stdout
    asyncio.run(_forget(env.redis_url, list(t.values())))
    lc.send_more(env, messages)
    assert (lc.balances(env, acc), lc.ledger(env, acc), lc.hold(env, t["hold"])) == before
    assert before[0] == (Decimal("95.00"), Decimal("40.00"), Decimal("55.00"))
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions")[0]["n"] == 0
    m = worker.metrics()
    assert m['payauth_messages_total{outcome="duplicate"}'] == len(messages)
    shown = payauth(env, "explain", t["rev"])  # still explained, from what the purge keeps
    assert shown.returncode == 0 and "lifecycle record remains" in shown.stdout, shown.stdout
    waiting = stack.fetch(env.dsn, "SELECT state FROM orphan_reversals")
    assert [r["state"] for r in waiting] == ["WAITING"]
    lc.verified(env)


def test_explain_shows_a_holds_life_and_verify_its_invariants(env, spawn_worker) -> None:
    t = lc.names("hold", "orph", "rev", "clr", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["orph"], "REVERSAL", acc, "5.00", t["hold"]),
        lc.msg(t["hold"], "AUTHORIZATION", acc, "50.00"),
        lc.msg(t["rev"], "REVERSAL", acc, "15.00", t["hold"]),
        lc.msg(t["clr"], "CLEARING", acc, "33.00", t["hold"]),
    ])
    life = payauth(env, "explain", t["hold"])
    assert life.returncode == 0, life.stderr
    for expected in (f"hold         {t['hold']} AUTHORIZATION 50.00 EUR: CLEARED, 0.00 still",
                     f"orphan     {t['orph']} REVERSAL 5.00 (came first): APPLIED, released "
                     "5.00", f"reversal   {t['rev']} 15.00", "released 15.00",
                     f"clearing   {t['clr']} 33.00", "released 30.00, ended it",
                     f"CLEARED by {t['clr']}"):
        assert expected in life.stdout, (expected, life.stdout)
    clearing = payauth(env, "explain", t["clr"])
    assert f"original     {t['hold']}; released from its hold 30.00 (ended the hold)" in \
        clearing.stdout, clearing.stdout
    assert f"its hold     {t['hold']}" in clearing.stdout

    # Decided again from their stored inputs, the rule as it is now changes nothing.
    shadow = payauth(env, "replay", "--shadow", "--to-earliest")
    assert shadow.returncode == 0, shadow.stdout + shadow.stderr
    assert re.search(r"decided transactions +4\n +unchanged +4\n", shadow.stdout), shadow.stdout
    verified = payauth(env, "verify")
    assert verified.returncode == 0, verified.stdout
    assert "PASS  a hold ends at most once" in verified.stdout
    # The negative control: a release the holds do not account for is found.
    stack.fetch(env.dsn, "UPDATE accounts SET held = held + 1 WHERE account_id = $1", acc)
    broken = payauth(env, "verify")
    assert broken.returncode != 0
    assert "FAIL  available = balance - held" in broken.stdout and acc in broken.stdout
