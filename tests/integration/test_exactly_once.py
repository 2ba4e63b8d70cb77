"""The exactly-once-in-effect claims, each proven by injecting its fault and checking the
invariants in the database afterwards: racing replicas, kill -9 between commit points,
Redis down, PostgreSQL unreachable, and a clean SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections import Counter
from decimal import Decimal

import pytest

from service.adapters.postgres import PostgresStore
from service.devtools.chaos.proxy import TcpProxy
from service.domain.messages import decode_authorization
from service.ops.verify import report, verify
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)






def assert_invariants(dsn: str) -> None:
    text, ok = report(run(verify(dsn)))
    assert ok, text


def seed(env: stack.Env, n: int, balance: str = "1000000.00") -> list[str]:
    accounts = [f"ACC-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    run(stack.seed_accounts(env.dsn, [(a, balance, "EUR") for a in accounts]))
    return accounts


def one_ledger_entry_each(dsn: str, txn_ids: set[str]) -> None:
    rows = stack.fetch(dsn, "SELECT txn_id, count(*) AS n FROM ledger_entries GROUP BY txn_id")
    counts = {r["txn_id"]: r["n"] for r in rows}
    assert set(counts) == txn_ids, f"missing {len(txn_ids - set(counts))}, " \
                                   f"extra {len(set(counts) - txn_ids)}"
    assert max(counts.values()) == 1


# --------------------------------------------------------------------------- races
def test_store_claim_race_lets_exactly_one_replica_win(env) -> None:
    """Two stores (two pools: two replicas) authorize the same transaction at the same
    moment, 200 times: every time exactly one commits it, the other's answer leaves it out
    (its claim lost, nothing of it written)."""
    (account,) = seed(env, 1)

    async def race() -> Counter[str]:
        a = await PostgresStore.connect(env.dsn, min_size=1, max_size=2)
        b = await PostgresStore.connect(env.dsn, min_size=1, max_size=2)
        outcomes: Counter[str] = Counter()
        try:
            for i in range(200):
                auth = decode_authorization(encode(auth_message(
                    f"RACE-{uuid.uuid4().hex[:10]}", account_id=account, amount="1.00")))
                results = await asyncio.gather(
                    *(s.authorize([auth], source_topic="t", source_partitions=[p],
                                  source_offsets=[i]) for p, s in enumerate((a, b))),
                    return_exceptions=True,
                )
                kinds = sorted(type(r).__name__ if not isinstance(r, list)
                               else "won" if r else "lost" for r in results)
                outcomes[",".join(kinds)] += 1
        finally:
            await a.close()
            await b.close()
        return outcomes

    outcomes = run(race())
    assert outcomes == Counter({"lost,won": 200}), outcomes
    rows = stack.fetch(env.dsn, "SELECT count(*) AS n, sum(amount) AS total FROM ledger_entries")
    assert rows[0]["n"] == 200 and rows[0]["total"] == Decimal("-200.00")
    assert_invariants(env.dsn)


@pytest.mark.partitions(2)
def test_same_transaction_on_two_partitions_two_workers(env, spawn_worker) -> None:
    """The payment network sends each transaction twice, once to each partition; two
    workers, one partition each, race on every one of them."""
    accounts = seed(env, 20)
    w1, w2 = spawn_worker(env, "w1"), spawn_worker(env, "w2")
    wait_until(lambda: sum(e.get("partitions") is not None for w in (w1, w2)
                           for e in w.events("partitions_assigned")) >= 2
               and all(w.events("partitions_assigned") for w in (w1, w2)), 60,
               "both workers to own a partition")
    txns = [f"DUP-{uuid.uuid4().hex[:12]}" for _ in range(300)]
    for partition in (0, 1):
        stack.produce(env.input_topic, [
            (accounts[i % 20], encode(auth_message(t, account_id=accounts[i % 20],
                                                   amount="3.00")))
            for i, t in enumerate(txns)
        ], partition=partition)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    one_ledger_entry_each(env.dsn, set(txns))
    assert_invariants(env.dsn)
    totals = Counter[str]()
    for w in (w1, w2):
        m = w.metrics()
        for outcome in ("approved", "duplicate"):
            totals[outcome] += int(m[f'payauth_messages_total{{outcome="{outcome}"}}'])
    assert totals == {"approved": 300, "duplicate": 300}
    # Every event is on the topic once the offsets are committed (published first). A
    # worker that lost a claim and found the decision not yet confirmed published publishes
    # it again: the same event, the same event_id (at least once), so the topic may hold
    # more than 300 and is read to its end.
    events = stack.events_of(stack.read_topic(env.output_topic))
    assert {e["transaction_id"] for e in events} == set(txns)
    assert len({e["event_id"] for e in events}) == 300
    for w in (w1, w2):
        assert w.terminate() == 0


# ----------------------------------------------------------------- kill -9 points
@pytest.mark.parametrize("point", ["after_db_commit", "after_publish", "after_redis_set"])
def test_kill_between_commit_points(env, spawn_worker, point: str) -> None:
    """SIGKILL at a commit point (the offset is never committed); the replacement reads the
    batch again: duplicates, no second debit, and every result event is on the output
    topic (a repeat carries the same event_id and decision)."""
    accounts = seed(env, 5)
    txns = [f"KILL-{uuid.uuid4().hex[:12]}" for _ in range(40)]
    stack.produce(env.input_topic, [
        (accounts[i % 5], encode(auth_message(t, account_id=accounts[i % 5], amount="7.00")))
        for i, t in enumerate(txns)
    ])
    doomed = spawn_worker(env, "doomed", PAYAUTH_TEST_FAULT_POINT=point)
    assert doomed.wait_exit(60) == -signal.SIGKILL
    assert doomed.events("fault_injected"), doomed.raw_log()[-2000:]
    committed_before = stack.fetch(env.dsn, "SELECT count(*) AS n FROM ledger_entries")[0]["n"]
    assert committed_before > 0, "the kill came after a COMMIT"

    replacement = spawn_worker(env, "replacement")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    one_ledger_entry_each(env.dsn, set(txns))
    assert_invariants(env.dsn)
    m = replacement.metrics()
    assert m['payauth_duplicates_total{layer="postgres"}'] + \
        m['payauth_duplicates_total{layer="redis"}'] >= committed_before
    events = stack.events_of(stack.read_topic(env.output_topic, expect=len(txns)))
    by_txn: dict[str, list[dict[str, object]]] = {}
    for e in events:
        by_txn.setdefault(str(e["transaction_id"]), []).append(e)
    assert set(by_txn) == set(txns), "an event for every decided transaction"
    for repeats in by_txn.values():
        assert all(r == repeats[0] for r in repeats), "repeats are identical"
    if point == "after_db_commit":
        assert m['payauth_events_published_total{kind="republish"}'] >= committed_before
    assert replacement.terminate() == 0


# ------------------------------------------------------------------------ Redis down
def test_redis_down_then_back_then_down_again(env, spawn_worker, tmp_path) -> None:
    port = stack.free_port()
    accounts = seed(env, 10)

    def batch(txns: list[str]) -> list[tuple[str, bytes]]:
        return [(accounts[i % 10], encode(auth_message(t, account_id=accounts[i % 10],
                                                       amount="1.00")))
                for i, t in enumerate(txns)]

    phase = [[f"R{n}-{uuid.uuid4().hex[:10]}" for _ in range(50)] for n in range(3)]
    worker = spawn_worker(env, PAYAUTH_REDIS_URL=f"redis://127.0.0.1:{port}/0",
                          PAYAUTH_REDIS_TIMEOUT_SECONDS="0.2")
    # 1. Redis was never there.
    stack.produce(env.input_topic, batch(phase[0]) + batch(phase[0][:10]))
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.metrics()["payauth_redis_up"] == 0
    # 2. Redis comes up: redeliveries of phase 0 are caught by PostgreSQL (cold cache),
    #    then cached; redeliveries of phase 1 after that are caught by Redis.
    server = stack.redis_server(port, tmp_path)
    try:
        wait_until(lambda: worker.metrics()["payauth_redis_up"] == 1, 20, "Redis seen up")
        stack.produce(env.input_topic, batch(phase[1]) + batch(phase[0][10:20]))
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        stack.produce(env.input_topic, batch(phase[1]))
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        wait_until(lambda: worker.metrics()['payauth_duplicates_total{layer="redis"}'] >= 1, 20,
                   "Redis to catch duplicates once it is back")
        assert worker.metrics()["payauth_redis_up"] == 1
    finally:
        # 3. Redis dies mid-run.
        server.kill()
        server.wait()
    stack.produce(env.input_topic, batch(phase[2]) + batch(phase[1]) + batch(phase[2]))
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    one_ledger_entry_each(env.dsn, set(phase[0] + phase[1] + phase[2]))
    assert_invariants(env.dsn)
    m = worker.metrics()
    assert m["payauth_redis_up"] == 0
    assert m['payauth_messages_total{outcome="approved"}'] == 150
    assert m['payauth_messages_total{outcome="duplicate"}'] == 10 + 10 + 50 + 50 + 50
    assert worker.terminate() == 0


# ------------------------------------------------------------------- PostgreSQL down
def test_postgres_unreachable_pauses_then_recovers(env, spawn_worker) -> None:
    """While PostgreSQL is unreachable nothing is committed (offsets stay put) and the worker
    stays in the group; when it is back, everything is processed exactly once."""
    proxy = TcpProxy(5432)
    try:
        accounts = seed(env, 4)
        dsn = env.dsn.replace("localhost:5432", f"127.0.0.1:{proxy.port}")
        worker = spawn_worker(env, PAYAUTH_DATABASE_URL=dsn,
                              PAYAUTH_RETRY_BACKOFF_MAX_MS="500")
        worker.wait_assigned()
        wait_until(lambda: worker.http_get("/readyz")[0] == 200, 30, "worker ready")
        proxy.cut()
        txns = [f"PG-{uuid.uuid4().hex[:12]}" for _ in range(60)]
        stack.produce(env.input_topic, [
            (accounts[i % 4], encode(auth_message(t, account_id=accounts[i % 4], amount="2.00")))
            for i, t in enumerate(txns)
        ])
        wait_until(lambda: worker.metrics().get(
            'payauth_retries_total{cause="store_unavailable"}', 0) >= 3, 30,
            "the worker to retry against the unreachable database")
        wait_until(lambda: worker.http_get("/readyz")[0] == 503, 10, "not ready")
        committed = stack.committed_offsets(env.group_id, env.input_topic, env.partitions)
        assert all(o < 0 for o in committed.values()), f"nothing committed: {committed}"
        assert worker.alive() and not worker.events("partitions_revoked")
        proxy.restore()
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        one_ledger_entry_each(env.dsn, set(txns))
        assert_invariants(env.dsn)
        wait_until(lambda: worker.http_get("/readyz")[0] == 200, 30, "ready again")
        assert worker.terminate() == 0
    finally:
        proxy.close()


# -------------------------------------------------------------------------- SIGTERM
def test_sigterm_finishes_work_commits_and_exits_zero(env, spawn_worker) -> None:
    accounts = seed(env, 3)
    txns = [f"TERM-{uuid.uuid4().hex[:12]}" for _ in range(500)]
    stack.produce(env.input_topic, [
        (accounts[i % 3], encode(auth_message(t, account_id=accounts[i % 3], amount="1.00")))
        for i, t in enumerate(txns)
    ])
    worker = spawn_worker(env, PAYAUTH_COMMIT_INTERVAL_MS="60000")  # only the final commit
    wait_until(lambda: worker.metrics().get('payauth_messages_total{outcome="approved"}', 0)
               > 0, 60, "work to start")
    assert worker.terminate() == 0
    assert worker.events("consumer_closed")
    processed = stack.fetch(env.dsn, "SELECT source_partition AS p, max(source_offset) AS o "
                               "FROM processed_transactions GROUP BY 1")
    committed = stack.committed_offsets(env.group_id, env.input_topic, env.partitions)
    for row in processed:
        assert committed[row["p"]] == row["o"] + 1, "what was committed to the DB is committed"
    assert_invariants(env.dsn)


def test_a_hanging_redis_is_a_timeout_not_a_stall(env, spawn_worker, tmp_path) -> None:
    port = stack.free_port()
    server = stack.redis_server(port, tmp_path)
    try:
        accounts = seed(env, 3)
        worker = spawn_worker(env, PAYAUTH_REDIS_URL=f"redis://127.0.0.1:{port}/0",
                              PAYAUTH_REDIS_TIMEOUT_SECONDS="0.2")
        wait_until(lambda: worker.metrics()["payauth_redis_up"] == 1, 20, "Redis seen up")
        server.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
        txns = [f"HANG-{uuid.uuid4().hex[:10]}" for _ in range(30)]
        stack.produce(env.input_topic, [
            (accounts[i % 3], encode(auth_message(t, account_id=accounts[i % 3])))
            for i, t in enumerate(txns)
        ])
        wait_caught_up(env.group_id, env.input_topic, env.partitions, timeout=60)
        one_ledger_entry_each(env.dsn, set(txns))
        assert worker.metrics()["payauth_redis_up"] == 0
        assert worker.terminate() == 0
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()


def test_every_store_session_carries_timeouts(env) -> None:
    """A stuck database becomes an error the worker retries, never a hang."""

    async def show() -> dict[str, str]:
        store = await PostgresStore.connect(env.dsn, min_size=1, max_size=1,
                                            statement_timeout_ms=1234, lock_timeout_ms=567)
        try:
            async with store._pool.acquire() as conn:
                return {name: await conn.fetchval(f"SHOW {name}") for name in
                        ("statement_timeout", "lock_timeout",
                         "idle_in_transaction_session_timeout")}
        finally:
            await store.close()

    assert run(show()) == {"statement_timeout": "1234ms", "lock_timeout": "567ms",
                           "idle_in_transaction_session_timeout": "3702ms"}
