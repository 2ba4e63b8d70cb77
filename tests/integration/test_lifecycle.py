"""The authorization lifecycle through a real worker (CONTRACT.md, "Authorization lifecycle"):
one test per rule, each message sent to the broker, decided by ``payauth run``, checked in
the database (holds, ledger, the balances view) and on the output and dead-letter topics."""

from __future__ import annotations

import asyncio
import re
import uuid
from decimal import Decimal
from typing import Any

from service.adapters.redis_cache import RedisDedupCache
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up


def _names(*names: str) -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    return {n: f"LC-{run}-{n}" for n in names}


def _msg(txn: str, kind: str, account: str, amount: str, original: str | None = None,
         **fields: Any) -> dict[str, Any]:
    extra = {} if original is None else {"original_transaction_id": original}
    return auth_message(txn, account_id=account, amount=amount, authorization_type=kind,
                        **extra, **fields)


def _run(env: stack.Env, spawn_worker: Any, messages: list[dict[str, Any]]) -> Any:
    """Send the messages (keyed by account, so in order per account), one worker decides
    them all; returns the worker (still running)."""
    stack.produce(env.input_topic, [(m["body"]["account_id"].encode(), encode(m))
                                    for m in messages])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    return worker


def _send_more(env: stack.Env, messages: list[dict[str, Any]]) -> None:
    stack.produce(env.input_topic, [(m["body"]["account_id"].encode(), encode(m))
                                    for m in messages])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)


def _balances(env: stack.Env, account: str) -> tuple[Decimal, Decimal, Decimal]:
    row = stack.fetch(env.dsn, "SELECT balance, held, available FROM account_balances "
                               "WHERE account_id = $1", account)[0]
    copy = stack.fetch(env.dsn, "SELECT held FROM accounts WHERE account_id = $1", account)
    assert copy[0]["held"] == row["held"]  # the decision's copy agrees with the holds
    return row["balance"], row["held"], row["available"]


def _hold(env: stack.Env, txn: str) -> dict[str, Any]:
    rows = stack.fetch(env.dsn, "SELECT amount, remaining, state, ended_by, released "
                                "FROM holds WHERE txn_id = $1", txn)
    return dict(rows[0]) if rows else {}


def _events(env: stack.Env, expect: int) -> dict[str, dict[str, Any]]:
    events = stack.events_of(stack.read_topic(env.output_topic, expect=expect))
    by_txn: dict[str, dict[str, Any]] = {}
    for e in events:
        assert by_txn.setdefault(e["transaction_id"], e) == e  # a repeat is the same event
    return by_txn


def _ledger(env: stack.Env, account: str) -> list[tuple[str, str, Decimal]]:
    rows = stack.fetch(env.dsn, "SELECT txn_id, type, amount FROM ledger_entries "
                                "WHERE account_id = $1 ORDER BY entry_id", account)
    return [(r["txn_id"], r["type"], r["amount"]) for r in rows]


def _dead_letters(env: stack.Env, expect: int) -> list[tuple[str, str]]:
    records = stack.read_topic(env.dlq_topic, expect=expect)
    out = []
    for r in records:
        headers = dict(r.headers() or [])
        out.append((headers["error.reason"].decode(), headers["error.detail"].decode()))
    return out


def _verified(env: stack.Env) -> None:
    done = payauth(env, "verify")
    assert done.returncode == 0, done.stdout + done.stderr


def _seed(env: stack.Env, *accounts: tuple[str, str]) -> None:
    asyncio.run(stack.seed_accounts(env.dsn, [(a, b, "EUR") for a, b in accounts]))


def test_partial_reversals_never_release_more_than_remains(env, spawn_worker) -> None:
    t = _names("hold", "r1", "r2", "r3", "acc")
    acc = t["acc"]
    _seed(env, (acc, "500.00"))
    r1 = _msg(t["r1"], "REVERSAL", acc, "60.00", t["hold"])
    worker = _run(env, spawn_worker, [
        _msg(t["hold"], "AUTHORIZATION", acc, "100.00"),
        r1,
        r1,  # redelivered
        {**r1, "headers": {**r1["headers"], "message_id": "msg-retry-r1"}},  # sent again
        _msg(t["r2"], "REVERSAL", acc, "60.00", t["hold"]),  # only 40 remain
        _msg(t["r3"], "REVERSAL", acc, "5.00", t["hold"]),  # after the hold ended
    ])
    assert _balances(env, acc) == (Decimal("500.00"), 0, Decimal("500.00"))
    hold = _hold(env, t["hold"])
    assert (hold["remaining"], hold["state"], hold["ended_by"]) == (0, "REVERSED", t["r2"])
    events = _events(env, expect=4)
    assert events[t["hold"]]["event_type"] == "PaymentAuthorized"
    applied = {k: (events[t[k]]["event_type"], events[t[k]]["amount"],
                   events[t[k]]["amount_applied"], events[t[k]]["result"])
               for k in ("r1", "r2", "r3")}
    assert applied == {"r1": ("PaymentReversed", "60.00", "60.00", "APPROVED"),
                       "r2": ("PaymentReversed", "60.00", "40.00", "APPROVED"),
                       "r3": ("PaymentReversed", "5.00", "0.00", "APPROVED")}
    _verified(env)
    assert events[t["r1"]]["original_transaction_id"] == t["hold"]
    assert _ledger(env, acc) == []  # holds and their releases never write the ledger
    m = worker.metrics()
    assert m['payauth_messages_total{outcome="duplicate"}'] == 2
    results = stack.fetch(env.dsn, "SELECT DISTINCT result FROM processed_transactions")
    assert [r["result"] for r in results] == ["APPROVED"]


def test_an_orphan_reversal_is_applied_when_its_original_arrives(env, spawn_worker) -> None:
    t = _names("full", "rfull", "part", "rpart", "acc")
    acc = t["acc"]
    _seed(env, (acc, "500.00"))
    _run(env, spawn_worker, [
        _msg(t["rfull"], "REVERSAL", acc, "100.00", t["full"]),  # before its original
        _msg(t["rpart"], "REVERSAL", acc, "30.00", t["part"]),
        _msg(t["full"], "AUTHORIZATION", acc, "100.00"),
        _msg(t["part"], "AUTHORIZATION", acc, "100.00"),
    ])
    assert _hold(env, t["full"])["state"] == "REVERSED"  # a full reversal: nothing held
    assert _hold(env, t["full"])["remaining"] == 0
    part = _hold(env, t["part"])
    assert (part["remaining"], part["state"]) == (Decimal("70.00"), "ACTIVE")
    assert _balances(env, acc) == (Decimal("500.00"), Decimal("70.00"), Decimal("430.00"))
    orphans = stack.fetch(env.dsn, "SELECT txn_id, state, applied FROM orphan_reversals")
    assert {r["txn_id"]: (r["state"], r["applied"]) for r in orphans} == {
        t["rfull"]: ("APPLIED", Decimal("100.00")), t["rpart"]: ("APPLIED", Decimal("30.00"))}
    events = _events(env, expect=4)
    assert events[t["rfull"]]["waiting_for_original"] is True
    assert events[t["rfull"]]["amount_applied"] == "0.00"  # nothing yet when it came


def test_clearings_over_under_forced_after_a_reversal(env, spawn_worker) -> None:
    t = _names("h1", "c1", "h2", "c2", "c3", "c4", "h3", "r3", "c5", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    _run(env, spawn_worker, [
        _msg(t["h1"], "AUTHORIZATION", acc, "50.00"),
        _msg(t["c1"], "CLEARING", acc, "60.00", t["h1"]),  # over the hold (a tip)
        _msg(t["h2"], "AUTHORIZATION", acc, "30.00"),
        _msg(t["c2"], "CLEARING", acc, "20.00", t["h2"]),  # under
        _msg(t["c3"], "CLEARING", acc, "5.00"),  # forced: no original
        _msg(t["c4"], "CLEARING", acc, "5.00", "NO-SUCH-HOLD"),  # forced: no such hold
        _msg(t["h3"], "AUTHORIZATION", acc, "10.00"),
        _msg(t["r3"], "REVERSAL", acc, "10.00", t["h3"]),
        _msg(t["c5"], "CLEARING", acc, "10.00", t["h3"]),  # after a full reversal: posts
    ])
    assert _balances(env, acc) == (Decimal("0.00"), 0, Decimal("0.00"))
    assert [(_hold(env, t[h])["state"], _hold(env, t[h])["released"])
            for h in ("h1", "h2", "h3")] == [("CLEARED", Decimal("50.00")),
                                             ("CLEARED", Decimal("30.00")),
                                             ("REVERSED", Decimal("10.00"))]
    assert _ledger(env, acc) == [(t["c1"], "CLEARING", Decimal("-60.00")),
                                 (t["c2"], "CLEARING", Decimal("-20.00")),
                                 (t["c3"], "CLEARING", Decimal("-5.00")),
                                 (t["c4"], "CLEARING", Decimal("-5.00")),
                                 (t["c5"], "CLEARING", Decimal("-10.00"))]
    events = _events(env, expect=9)
    cleared = {k: (events[t[k]]["event_type"], events[t[k]]["original_transaction_id"],
                   events[t[k]]["amount"], events[t[k]]["forced"])
               for k in ("c1", "c2", "c3", "c4", "c5")}
    assert cleared == {"c1": ("PaymentCleared", t["h1"], "60.00", False),
                       "c2": ("PaymentCleared", t["h2"], "20.00", False),
                       "c3": ("PaymentCleared", None, "5.00", True),
                       "c4": ("PaymentCleared", None, "5.00", True),
                       "c5": ("PaymentCleared", t["h3"], "10.00", False)}
    _verified(env)


def test_a_clearing_takes_the_balance_below_zero(env, spawn_worker) -> None:
    t = _names("h", "c", "acc")
    acc = t["acc"]
    _seed(env, (acc, "10.00"))
    _run(env, spawn_worker, [_msg(t["h"], "AUTHORIZATION", acc, "10.00"),
                             _msg(t["c"], "CLEARING", acc, "25.00", t["h"])])
    assert _balances(env, acc) == (Decimal("-15.00"), 0, Decimal("-15.00"))
    _verified(env)


def test_an_advice_is_placed_past_the_available_balance(env, spawn_worker) -> None:
    t = _names("adv", "auth", "buy", "acc")
    acc = t["acc"]
    _seed(env, (acc, "50.00"))
    _run(env, spawn_worker, [
        _msg(t["adv"], "ADVICE", acc, "80.00"),
        _msg(t["auth"], "AUTHORIZATION", acc, "1.00"),  # against the available balance
        _msg(t["buy"], "PURCHASE", acc, "1.00"),  # so is a purchase
    ])
    assert _balances(env, acc) == (Decimal("50.00"), Decimal("80.00"), Decimal("-30.00"))
    events = _events(env, expect=3)
    assert (events[t["adv"]]["event_type"], events[t["adv"]]["authorization_type"]) == \
        ("PaymentAuthorized", "ADVICE")
    assert [events[t[k]]["decline_reason"] for k in ("auth", "buy")] == \
        ["INSUFFICIENT_FUNDS", "INSUFFICIENT_FUNDS"]
    _verified(env)


def test_purchases_are_decided_against_the_available_balance(env, spawn_worker) -> None:
    t = _names("hold", "buy", "small", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    worker = _run(env, spawn_worker, [_msg(t["hold"], "AUTHORIZATION", acc, "80.00")])
    # A batch of purchases only: the purchase path (payauth_authorize) reads held too.
    _send_more(env, [_msg(t["buy"], "PURCHASE", acc, "30.00"),
                     _msg(t["small"], "PURCHASE", acc, "20.00")])
    events = _events(env, expect=3)
    assert events[t["buy"]]["decline_reason"] == "INSUFFICIENT_FUNDS"
    assert events[t["small"]]["result"] == "APPROVED"
    assert _balances(env, acc) == (Decimal("80.00"), Decimal("80.00"), Decimal("0.00"))
    assert worker.alive()


def test_a_reversal_of_a_declined_authorization_changes_nothing(env, spawn_worker) -> None:
    t = _names("auth", "rev", "orph", "late", "acc")
    acc = t["acc"]
    _seed(env, (acc, "50.00"))
    _run(env, spawn_worker, [
        _msg(t["orph"], "REVERSAL", acc, "10.00", t["late"]),  # its original is declined
        _msg(t["auth"], "AUTHORIZATION", acc, "1000.00"),
        _msg(t["rev"], "REVERSAL", acc, "1000.00", t["auth"]),
        _msg(t["late"], "AUTHORIZATION", acc, "1000.00"),
    ])
    assert _balances(env, acc) == (Decimal("50.00"), 0, Decimal("50.00"))
    assert _ledger(env, acc) == []
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds")[0]["n"] == 0
    events = _events(env, expect=4)
    assert (events[t["rev"]]["result"], events[t["rev"]]["amount_applied"]) == \
        ("APPROVED", "0.00")
    orphan = stack.fetch(env.dsn, "SELECT state FROM orphan_reversals")
    assert [r["state"] for r in orphan] == ["VOID"]


def test_a_reversal_of_a_purchase_credits_back_what_is_not_yet_reversed(env,
                                                                       spawn_worker) -> None:
    t = _names("buy", "r1", "r2", "r3", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    _run(env, spawn_worker, [
        _msg(t["buy"], "PURCHASE", acc, "70.00"),
        _msg(t["r1"], "REVERSAL", acc, "50.00", t["buy"]),
        _msg(t["r2"], "REVERSAL", acc, "50.00", t["buy"]),  # 20 left to credit
        _msg(t["r3"], "REVERSAL", acc, "50.00", t["buy"]),  # nothing left
    ])
    assert _balances(env, acc) == (Decimal("100.00"), 0, Decimal("100.00"))
    assert _ledger(env, acc) == [(t["buy"], "PURCHASE", Decimal("-70.00")),
                                 (t["r1"], "REVERSAL", Decimal("50.00")),
                                 (t["r2"], "REVERSAL", Decimal("20.00"))]
    events = _events(env, expect=4)
    assert [events[t[k]]["amount_applied"] for k in ("r1", "r2", "r3")] == \
        ["50.00", "20.00", "0.00"]
    _verified(env)


def test_mismatched_originals_are_dead_lettered_and_change_nothing(env, spawn_worker) -> None:
    t = _names("hold", "other", "refund", "buy", "m1", "m2", "m3", "m4", "m5", "acc", "acc2")
    acc, acc2 = t["acc"], t["acc2"]
    _seed(env, (acc, "100.00"), (acc2, "100.00"))
    _run(env, spawn_worker, [
        _msg(t["hold"], "AUTHORIZATION", acc, "40.00"),
        _msg(t["refund"], "REFUND", acc, "5.00"),
        _msg(t["buy"], "PURCHASE", acc, "5.00"),
        _msg(t["m2"], "REVERSAL", acc, "10.00", t["hold"], currency="USD"),  # currency
        _msg(t["m3"], "REVERSAL", acc, "1.00", t["refund"]),  # names a REFUND
        _msg(t["m4"], "CLEARING", acc, "1.00", t["buy"]),  # a clearing of a purchase
    ])
    # Another account's messages come on another partition, in no order with these: sent
    # once the originals are decided.
    _send_more(env, [_msg(t["m1"], "REVERSAL", acc2, "10.00", t["hold"]),
                     _msg(t["m5"], "CLEARING", acc2, "10.00", t["hold"])])
    letters = _dead_letters(env, expect=5)
    assert [reason for reason, _ in letters] == ["LIFECYCLE_MISMATCH"] * 5
    assert any("another account" in detail for _, detail in letters)
    assert _balances(env, acc) == (Decimal("100.00"), Decimal("40.00"), Decimal("60.00"))
    assert _balances(env, acc2) == (Decimal("100.00"), 0, Decimal("100.00"))
    decided = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")
    assert {r["txn_id"] for r in decided} == {t["hold"], t["refund"], t["buy"]}


def test_a_conflicting_body_is_a_conflict(env, spawn_worker) -> None:
    t = _names("hold", "rev", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    _run(env, spawn_worker, [
        _msg(t["hold"], "AUTHORIZATION", acc, "40.00"),
        _msg(t["rev"], "REVERSAL", acc, "10.00", t["hold"]),
        _msg(t["rev"], "REVERSAL", acc, "10.00", "ANOTHER-ORIGINAL"),
        _msg(t["rev"], "REVERSAL", acc, "11.00", t["hold"]),
    ])
    assert [r for r, _ in _dead_letters(env, expect=2)] == ["IDEMPOTENCY_KEY_CONFLICT"] * 2
    assert _balances(env, acc) == (Decimal("100.00"), Decimal("30.00"), Decimal("70.00"))


async def _forget(url: str, txn_ids: list[str]) -> None:
    cache = RedisDedupCache.from_url(url, ttl_seconds=86_400, timeout_seconds=2)
    try:
        await cache.forget(txn_ids)
    finally:
        await cache.close()


def test_a_redelivery_after_the_dedup_purge_changes_nothing(env, spawn_worker) -> None:
    t = _names("hold", "adv", "rev", "clr", "declined", "orph", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    messages = [
        _msg(t["hold"], "AUTHORIZATION", acc, "60.00"),
        _msg(t["adv"], "ADVICE", acc, "10.00"),
        _msg(t["rev"], "REVERSAL", acc, "20.00", t["hold"]),
        _msg(t["clr"], "CLEARING", acc, "5.00", t["adv"]),
        _msg(t["declined"], "AUTHORIZATION", acc, "1000.00"),
        _msg(t["orph"], "REVERSAL", acc, "1.00", "NOT-YET"),
    ]
    worker = _run(env, spawn_worker, messages)
    before = (_balances(env, acc), _ledger(env, acc), _hold(env, t["hold"]))
    # The retention passes (decided 100 h ago), `payauth purge` runs, the fast path forgets.
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = processed_at - interval '100 hours'")
    purged = payauth(env, "purge")
    assert purged.returncode == 0, purged.stderr
    assert f"deleted {len(messages)} dedup record(s)" in purged.stdout, purged.stdout
    asyncio.run(_forget(env.redis_url, list(t.values())))
    _send_more(env, messages)
    assert (_balances(env, acc), _ledger(env, acc), _hold(env, t["hold"])) == before
    assert before[0] == (Decimal("95.00"), Decimal("40.00"), Decimal("55.00"))
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions")[0]["n"] == 0
    m = worker.metrics()
    assert m['payauth_messages_total{outcome="duplicate"}'] == len(messages)
    shown = payauth(env, "explain", t["rev"])  # still explained, from what the purge keeps
    assert shown.returncode == 0 and "lifecycle record remains" in shown.stdout, shown.stdout
    waiting = stack.fetch(env.dsn, "SELECT state FROM orphan_reversals")
    assert [r["state"] for r in waiting] == ["WAITING"]
    _verified(env)


def test_explain_shows_a_holds_life_and_verify_its_invariants(env, spawn_worker) -> None:
    t = _names("hold", "orph", "rev", "clr", "acc")
    acc = t["acc"]
    _seed(env, (acc, "100.00"))
    _run(env, spawn_worker, [
        _msg(t["orph"], "REVERSAL", acc, "5.00", t["hold"]),
        _msg(t["hold"], "AUTHORIZATION", acc, "50.00"),
        _msg(t["rev"], "REVERSAL", acc, "15.00", t["hold"]),
        _msg(t["clr"], "CLEARING", acc, "33.00", t["hold"]),
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
