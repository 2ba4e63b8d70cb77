"""PostgreSQL failover under a running worker, on real streaming replication: the primary is
killed (SIGKILL) in the middle of a burst and the standby promoted. The worker, given both
hosts (``target_session_attrs=read-write``), reconnects to the new primary without a
restart. With synchronous replication nothing the worker was told committed is lost: every
published event has its decision on the new primary, each transaction decided and debited
once. The negative control runs the same failover with the standby behind (asynchronous
replication, the standby stopped during the burst): the same check must then report the
decisions the new primary does not have, or it could not see the failure it is for."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.pg_pair import Node, remove, replicated_pair
from tests.support.workers import payauth, wait_caught_up, wait_until

ACCOUNTS = [f"ACC-FO-{i}" for i in range(4)]


def _send(env: stack.Env, count: int, tag: str) -> list[str]:
    ids = [f"FO-{tag}-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    stack.produce(env.input_topic, [
        (ACCOUNTS[i % 4].encode(), encode(auth_message(t, account_id=ACCOUNTS[i % 4],
                                                       amount="1.00")))
        for i, t in enumerate(ids)])
    return ids


def _send_paced(env: stack.Env, count: int, tag: str) -> list[str]:
    """``count`` transactions over about two seconds, a few at a time."""
    ids: list[str] = []
    for _ in range(count // 10):
        ids += _send(env, 10, tag)
        time.sleep(0.1)
    return ids


def _decisions_missing_for_events(node: Node, events: list[dict[str, Any]]) -> list[str]:
    """Transactions with a published result event and no decision in this database: what a
    failover lost after the worker was told it committed."""
    published = {e["transaction_id"] for e in events}
    rows = stack.fetch(node.dsn("payauth"), "SELECT txn_id FROM processed_transactions "
                                            "WHERE txn_id = ANY($1::text[])", sorted(published))
    return sorted(published - {r["txn_id"] for r in rows})


def _prepare(env: stack.Env, primary: Node) -> None:
    """The payauth database on the primary, migrated, with the test's accounts."""
    stack.fetch(primary.dsn(), "CREATE DATABASE payauth")
    assert payauth(env, "migrate", PAYAUTH_DATABASE_URL=primary.dsn("payauth")).returncode == 0
    asyncio.run(stack.seed_accounts(primary.dsn("payauth"),
                                    [(a, "10000.00", "EUR") for a in ACCOUNTS]))


def _approved(worker: Any) -> float:
    try:
        return worker.metrics().get('payauth_messages_total{outcome="approved"}', 0.0)
    except Exception:
        return 0.0  # between scrapes of a worker busy reconnecting


def _failover(env: stack.Env, spawn_worker: Any, *, synchronous: bool
              ) -> tuple[Node, Path, list[str], list[dict[str, Any]], Any]:
    """Run the failover; returns the new primary (still running) and the pair's directory,
    what was sent, the result events and the worker."""
    primary, standby, base = replicated_pair(synchronous=synchronous)
    try:
        _prepare(env, primary)
        url = (f"postgresql://postgres@{primary.address},{standby.address}/payauth"
               "?target_session_attrs=read-write")
        worker = spawn_worker(env, PAYAUTH_DATABASE_URL=url)
        sent = _send(env, 200, "a")
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        if synchronous:
            # The primary dies in the middle of a burst: messages keep arriving meanwhile.
            burst = threading.Thread(target=lambda: sent.extend(_send_paced(env, 200, "b")))
            burst.start()
            wait_until(lambda: _approved(worker) >= 260, 60, "the burst under way")
            primary.kill9()
            burst.join()
        else:
            wait_until(lambda: standby.caught_up_with(primary), 30, "the standby caught up")
            standby.stop()  # behind from now on: it will miss the whole burst
            sent += _send(env, 200, "b")
            # Every one of the burst decided, published and committed on the primary alone.
            wait_until(lambda: _approved(worker) >= 400, 60, "the burst decided")
            primary.kill9()
        if not synchronous:
            standby.start()
        standby.promote()
        sent += _send(env, 100, "c")
        wait_caught_up(env.group_id, env.input_topic, env.partitions, timeout=180)
        events = stack.events_of(stack.read_topic(env.output_topic, expect=len(sent)))
        assert worker.alive(), "the worker must follow the failover, not restart"
        assert worker.terminate() == 0
        primary.stop()  # already dead; nothing to stop unless the kill failed
        return standby, base, sent, events, worker
    except BaseException:
        remove(base, primary, standby)
        raise


def test_a_synchronous_standby_promoted_loses_nothing(env, spawn_worker) -> None:
    new_primary, base, sent, events, worker = _failover(env, spawn_worker, synchronous=True)
    try:
        assert _decisions_missing_for_events(new_primary, events) == []
        assert {e["transaction_id"] for e in events} == set(sent)  # none dropped
        decided = stack.fetch(new_primary.dsn("payauth"), "SELECT count(*) AS n, "
                              "count(DISTINCT txn_id) AS d FROM processed_transactions")[0]
        assert (decided["n"], decided["d"]) == (len(sent), len(sent))
        ledger = stack.fetch(new_primary.dsn("payauth"), "SELECT count(*) AS n, sum(amount) "
                             "AS total FROM ledger_entries")[0]
        assert (ledger["n"], ledger["total"]) == (len(sent), -len(sent))
        assert payauth(env, "verify", PAYAUTH_DATABASE_URL=new_primary.dsn("payauth")
                       ).returncode == 0
        # It noticed: batches waited for the database, then went on.
        assert worker.events("batch_retry")
    finally:
        remove(base, new_primary)


def test_the_check_sees_what_an_asynchronous_failover_loses(env, spawn_worker) -> None:
    new_primary, base, sent, events, _ = _failover(env, spawn_worker, synchronous=False)
    try:
        missing = _decisions_missing_for_events(new_primary, events)
        # The burst was decided, published and its offsets committed on the old primary,
        # which the standby never saw: every one of those decisions is gone.
        burst = {t for t in sent if t.startswith("FO-b-")}
        assert set(missing) == burst, (len(missing), len(burst))
    finally:
        remove(base, new_primary)


def _has(node: Node, txn: str) -> bool:
    return bool(stack.fetch(node.dsn("payauth"), "SELECT 1 FROM processed_transactions "
                                                 "WHERE txn_id = $1", txn))


def test_a_decision_whose_wait_for_the_standby_was_cancelled_is_published_once_replicated(
        env, spawn_worker) -> None:
    """The worker's own timeout cancels its COMMIT's wait for the synchronous standby:
    PostgreSQL keeps the commit on the primary alone (a WARNING, not an error), visible to
    the worker's retry. Published then, a failover would lose a decision the world has
    seen: the retry must wait until the standby confirms (PostgresStore.load_stored)."""
    primary, standby, base = replicated_pair(synchronous=True)
    worker = None
    try:
        _prepare(env, primary)
        # statement timeout 1 s: the client gives up on a call after 2 s and cancels it
        worker = spawn_worker(env, PAYAUTH_DATABASE_URL=primary.dsn("payauth"),
                              PAYAUTH_STATEMENT_TIMEOUT_MS="1000")
        warm = _send(env, 4, "w")
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        receiver = stack.fetch(standby.dsn(), "SELECT pid FROM pg_stat_activity "
                                              "WHERE backend_type = 'walreceiver'")[0]["pid"]
        os.kill(receiver, signal.SIGSTOP)  # the standby acknowledges nothing from now on
        try:
            [held] = _send(env, 1, "held")
            wait_until(lambda: _has(primary, held), 30, "the decision committed on the primary")
            assert not _has(standby, held)
            time.sleep(6)  # the worker retries: it finds the decision, it must not publish it
            published = {e["transaction_id"] for e in
                         stack.events_of(stack.read_topic(env.output_topic, timeout=3))}
            assert published == set(warm), "published before the standby had it"
            assert worker.events("batch_retry"), "the worker kept the batch and retried"
        finally:
            os.kill(receiver, signal.SIGCONT)
        events = stack.events_of(stack.read_topic(env.output_topic, expect=5, timeout=60))
        assert {e["transaction_id"] for e in events} == {*warm, held}
        wait_until(lambda: _has(standby, held), 30, "the standby has the decision")
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        decided = stack.fetch(primary.dsn("payauth"), "SELECT count(*) AS n FROM "
                              "processed_transactions WHERE txn_id = $1", held)[0]["n"]
        assert decided == 1
        assert worker.terminate() == 0
    finally:
        if worker is not None and worker.alive():
            worker.kill()
        remove(base, primary, standby)
