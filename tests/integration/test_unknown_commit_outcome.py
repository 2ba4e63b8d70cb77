"""A connection that breaks during the authorize call leaves its outcome unknown to the
worker: here PostgreSQL committed, and the socket is closed before the worker reads the
reply (``PAYAUTH_TEST_FAULT_POINT=connection_lost_after_commit``, once), as a network cut or
a failover would. The retry must find the decisions in the database: every transaction
decided once, debited once, and its event published (none dropped), the worker still up."""

from __future__ import annotations

import asyncio
import uuid

from service.domain.messages import event_id_for
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up


def test_a_reply_lost_after_the_commit_is_found_out_by_the_retry(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:6]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    debits = [f"UO-{uuid.uuid4().hex[:8]}" for _ in range(10)]
    declined = [f"UO-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    records = [(account.encode(), encode(auth_message(t, account_id=account, amount="7.00")))
               for t in debits]
    records += [(b"nobody", encode(auth_message(t, account_id="NO-SUCH-ACCOUNT")))
                for t in declined]
    stack.produce(env.input_topic, records)
    worker = spawn_worker(env, PAYAUTH_TEST_FAULT_POINT="connection_lost_after_commit")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    assert [e["point"] for e in worker.events("fault_injected")] == \
        ["connection_lost_after_commit"], "the fault did not happen"
    assert worker.alive(), "a lost reply must be retried, not crash the worker"
    assert worker.metrics()['payauth_retries_total{cause="store_unavailable"}'] >= 1
    events = stack.events_of(stack.read_topic(env.output_topic, expect=15))
    by_txn: dict[str, set[tuple[str, str]]] = {}
    for event in events:
        by_txn.setdefault(event["transaction_id"], set()).add(
            (event["event_id"], event["event_type"]))
    assert set(by_txn) == set(debits + declined), "a decision was dropped"
    assert all(len(kinds) == 1 for kinds in by_txn.values()), by_txn  # one answer each
    assert all(next(iter(by_txn[t]))[0] == event_id_for(t) for t in by_txn)
    assert {next(iter(by_txn[t]))[1] for t in debits} == {"PaymentAuthorized"}
    assert worker.terminate() == 0

    ledger = stack.fetch(env.dsn, "SELECT count(*) AS n, sum(amount) AS total FROM "
                                  "ledger_entries")[0]
    assert (ledger["n"], ledger["total"]) == (10, -70)
    balance = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1",
                          account)[0]["balance"]
    assert balance == 30
    decided = stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions")[0]["n"]
    assert decided == 15
    assert payauth(env, "verify").returncode == 0
