"""Holds end once: ``payauth holds expire`` (two runs at once, a worker clearing the same
holds meanwhile), a clearing after expiry, an expiry of what an increment and a partial
clearing left, a worker killed inside the transaction of a
reversal, and the expiry's outbox marked while a batch keeps some of its holds locked (two
connections)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from decimal import Decimal

import asyncpg

from service.adapters.postgres import PostgresStore
from service.ops import holds as hold_ops
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.factory import authorization, encode
from tests.support.workers import payauth, wait_caught_up


def _age(env: stack.Env, txn_ids: list[str], hours: float) -> None:
    """Placed ``hours`` ago by the database's clock (as if decided then)."""
    stack.fetch(env.dsn, "UPDATE holds SET placed_at = now() - $2::numeric * interval '1 hour' "
                         "WHERE txn_id = ANY($1::text[])", txn_ids, str(hours))


def _expire_at_once(env: stack.Env, runs: int, **overrides: str) -> list[tuple[int, str]]:
    procs = [subprocess.Popen(
        [sys.executable, "-m", "service", "holds", "expire", "--execute"], cwd=stack.ROOT,
        env={**env.worker_env(**overrides), "PAYAUTH_LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(runs)]
    return [(p.wait(120), p.stdout.read() if p.stdout else "") for p in procs]


def test_two_expiry_runs_at_once_under_a_running_worker_end_each_hold_once(
        env, spawn_worker) -> None:
    accounts = [f"EXP-{i}-{lc.names('a')['a']}" for i in range(4)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "10000.00", "EUR") for a in accounts]))
    holds = [f"{a}-H{j}" for a in accounts for j in range(10)]
    lc.run(env, spawn_worker, [lc.msg(h, "AUTHORIZATION", h.rsplit("-H", 1)[0], "10.00")
                             for h in holds])
    old, young = holds[::2], holds[1::2]
    _age(env, old, 2)  # older than 1.5 h; the others were just placed

    dry = payauth(env, "holds", "expire", PAYAUTH_HOLD_EXPIRY_HOURS="1.5")
    assert dry.returncode == 0, dry.stderr
    assert f"{len(old)} hold(s) would expire" in dry.stdout
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds WHERE state = 'ACTIVE'"
                       )[0]["n"] == len(holds)

    # While the runs go, the worker clears some of the old holds (and some young ones).
    cleared = old[:6] + young[:2]
    stack.produce(env.input_topic, [
        (h.rsplit("-H", 1)[0].encode(), encode(lc.msg(f"{h}-C", "CLEARING", h.rsplit("-H", 1)[0],
                                                    "10.00", h))) for h in cleared])
    done = _expire_at_once(env, 2, PAYAUTH_HOLD_EXPIRY_HOURS="1.5")
    assert [rc for rc, _ in done] == [0, 0], done
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    states = {r["txn_id"]: (r["state"], r["ended_by"]) for r in stack.fetch(
        env.dsn, "SELECT txn_id, state, ended_by FROM holds")}
    for h in old:  # ended once: by its clearing or by the expiry, never both
        assert states[h][0] in ("EXPIRED", "CLEARED"), (h, states[h])
    assert {states[h][0] for h in young} <= {"ACTIVE", "CLEARED"}
    assert all(states[h][0] == "CLEARED" for h in young[:2])
    expired = sorted(h for h, (s, _) in states.items() if s == "EXPIRED")
    assert expired and set(expired) <= set(old)
    ended = sum(int(out.split(" hold(s) expired")[0].rsplit(" ", 1)[1])
                for _, out in done)
    assert ended == len(expired)  # each hold ended by exactly one of the two runs

    events = stack.events_of(stack.read_topic(env.output_topic))
    hold_expired = [e for e in events if e["event_type"] == "HoldExpired"]
    assert sorted({e["transaction_id"] for e in hold_expired}) == expired
    assert len({e["event_id"] for e in hold_expired}) == len(expired)  # one id per hold
    assert all(e["amount_released"] == "10.00" and e["result"] == "APPROVED"
               for e in hold_expired)
    cleared_events = {e["original_transaction_id"]: e for e in events
                      if e["event_type"] == "PaymentCleared"}
    for h in old[:6]:  # a clearing after expiry still posts, and releases nothing more
        released = cleared_events[h]["amount_released"]
        assert released == ("0.00" if states[h][0] == "EXPIRED" else "10.00")
    unpublished = stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds WHERE state = "
                                       "'EXPIRED' AND expiry_published_at IS NULL")
    assert unpublished[0]["n"] == 0
    for a in accounts:
        balance, held, available = lc.balances(env, a)
        assert available == balance - held
    # The ledger moved only by the clearings.
    posted = stack.fetch(env.dsn, "SELECT count(*) AS n, sum(amount) AS s FROM ledger_entries")
    assert (posted[0]["n"], posted[0]["s"]) == (len(cleared), Decimal("-10.00") * len(cleared))

    again = _expire_at_once(env, 1, PAYAUTH_HOLD_EXPIRY_HOURS="1.5")
    assert again[0][0] == 0 and "0 hold(s) expired" in again[0][1]
    assert Counter(e["event_type"] for e in stack.events_of(
        stack.read_topic(env.output_topic)))["HoldExpired"] == len(hold_expired)


def test_a_clearing_after_expiry_posts_and_releases_nothing(env, spawn_worker) -> None:
    t = lc.names("hold", "clr", "rev", "acc")
    acc = t["acc"]
    asyncio.run(stack.seed_accounts(env.dsn, [(acc, "100.00", "EUR")]))
    lc.run(env, spawn_worker, [lc.msg(t["hold"], "AUTHORIZATION", acc, "40.00")])
    _age(env, [t["hold"]], 200)
    done = payauth(env, "holds", "expire", "--execute")  # the default: 168 h
    assert done.returncode == 0, done.stderr
    assert lc.hold(env, t["hold"])["state"] == "EXPIRED"
    assert lc.balances(env, acc) == (Decimal("100.00"), 0, Decimal("100.00"))
    lc.send_more(env, [lc.msg(t["rev"], "REVERSAL", acc, "10.00", t["hold"]),
                     lc.msg(t["clr"], "CLEARING", acc, "45.00", t["hold"])])
    assert lc.balances(env, acc) == (Decimal("55.00"), 0, Decimal("55.00"))
    hold = lc.hold(env, t["hold"])
    assert (hold["state"], hold["released"], hold["ended_by"]) == \
        ("EXPIRED", Decimal("40.00"), None)


def test_an_expiry_releases_what_remains_of_an_incremented_and_partly_cleared_hold(
        env, spawn_worker) -> None:
    """A hold of 50.00, incremented by 20.00, cleared 30.00 in part (not final): 40.00
    remains, and that is what its expiry releases; the account's other hold, placed just
    now, stays held."""
    t = lc.names("hold", "inc", "part", "young", "acc")
    acc = t["acc"]
    asyncio.run(stack.seed_accounts(env.dsn, [(acc, "100.00", "EUR")]))
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", acc, "50.00"),
        lc.msg(t["inc"], "INCREMENTAL", acc, "20.00", t["hold"]),
        lc.msg(t["part"], "CLEARING", acc, "30.00", t["hold"], final=False),
        lc.msg(t["young"], "AUTHORIZATION", acc, "10.00")])
    assert lc.balances(env, acc) == (Decimal("70.00"), Decimal("50.00"), Decimal("20.00"))
    _age(env, [t["hold"]], 200)
    done = payauth(env, "holds", "expire", "--execute")  # the default: 168 h
    assert done.returncode == 0, done.stderr
    hold = lc.hold(env, t["hold"])
    assert (hold["state"], hold["released"], hold["remaining"]) == \
        ("EXPIRED", Decimal("40.00"), 0)
    assert lc.balances(env, acc) == (Decimal("70.00"), Decimal("10.00"), Decimal("60.00"))
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    [expired] = [e for e in stack.events_of(stack.read_topic(env.output_topic))
                 if e["event_type"] == "HoldExpired"]
    assert expired["amount_released"] == "40.00"
    lc.verified(env)


def test_a_worker_killed_inside_a_reversals_transaction_releases_once(env,
                                                                     spawn_worker) -> None:
    t = lc.names("hold", "r1", "r2", "acc")
    acc = t["acc"]
    asyncio.run(stack.seed_accounts(env.dsn, [(acc, "100.00", "EUR")]))
    first = lc.run(env, spawn_worker, [lc.msg(t["hold"], "AUTHORIZATION", acc, "50.00")])
    first.kill()
    stack.produce(env.input_topic, [(acc.encode(), encode(m)) for m in (
        lc.msg(t["r1"], "REVERSAL", acc, "30.00", t["hold"]),
        lc.msg(t["r2"], "REVERSAL", acc, "30.00", t["hold"]))])
    doomed = spawn_worker(env, "doomed", PAYAUTH_TEST_FAULT_POINT="inside_db_transaction")
    assert doomed.wait_exit(90) == -signal.SIGKILL
    assert doomed.events("fault_injected"), doomed.raw_log()[-2000:]
    # Its writes never committed: the hold as placed, no reversal recorded.
    assert lc.hold(env, t["hold"])["remaining"] == Decimal("50.00")
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM lifecycle_messages "
                                "WHERE kind = 'REVERSAL'")[0]["n"] == 0

    spawn_worker(env, "replacement")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    hold = lc.hold(env, t["hold"])
    assert (hold["remaining"], hold["state"], hold["ended_by"]) == (0, "REVERSED", t["r2"])
    assert lc.balances(env, acc) == (Decimal("100.00"), 0, Decimal("100.00"))
    applied = stack.fetch(env.dsn, "SELECT txn_id, amount_applied FROM lifecycle_messages "
                                   "WHERE kind = 'REVERSAL' ORDER BY txn_id")
    assert {r["txn_id"]: r["amount_applied"] for r in applied} == \
        {t["r1"]: Decimal("30.00"), t["r2"]: Decimal("20.00")}


def test_the_outbox_marked_while_a_batch_keeps_its_holds_waits_for_the_account(
        env: stack.Env) -> None:
    """1. A batch has locked an account and the second of its two expired holds (as the
    lifecycle route locks its messages' holds, after the accounts). 2. The expiry run marks
    both published: it must wait for the account before it takes any hold. 3. The batch
    locks the first hold, and commits: nobody deadlocks (seen failing, "deadlock detected",
    with the holds updated without the account's lock)."""
    t = lc.names("h1", "h2", "acc")
    acc = t["acc"]
    asyncio.run(stack.seed_accounts(env.dsn, [(acc, "100.00", "EUR")]))
    first, second = sorted([t["h1"], t["h2"]])

    async def scenario() -> None:
        store = await PostgresStore.connect(env.dsn)
        try:
            await stack.authorize_in_order(store, [
                authorization(first, acc, "10.00", "AUTHORIZATION"),
                authorization(second, acc, "10.00", "AUTHORIZATION")])
        finally:
            await store.close()
        await (await asyncpg.connect(env.dsn)).execute(
            "UPDATE holds SET state = 'EXPIRED', ended_at = now(), released = remaining, "
            "remaining = 0 WHERE txn_id = ANY($1)",
            [first, second])
        batch = await asyncpg.connect(env.dsn)
        marker = await asyncpg.connect(env.dsn, server_settings={
            "application_name": "payauth-expiry"})
        try:
            tx = batch.transaction()
            await tx.start()
            await batch.execute("SELECT 1 FROM accounts WHERE account_id = $1 FOR UPDATE", acc)
            await batch.execute("SELECT 1 FROM holds WHERE txn_id = $1 FOR UPDATE", second)
            marking = asyncio.create_task(hold_ops.mark_published(marker, [first, second]))
            await stack.until_a_lock_is_awaited(env.dsn, "payauth-expiry")
            await batch.execute("SELECT 1 FROM holds WHERE txn_id = $1 FOR UPDATE", first)
            await tx.commit()
            await asyncio.wait_for(marking, 10)
        finally:
            await batch.close()
            await marker.close()

    asyncio.run(scenario())
    marked = stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds WHERE txn_id = ANY($1) "
                                  "AND expiry_published_at IS NOT NULL", [first, second])
    assert marked[0]["n"] == 2
