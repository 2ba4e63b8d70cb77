"""Operating payauth: replay after a bug fix, DLQ redrive, retention — against the real broker
and database. The "bug" is a validation setting that dead-letters a good message; the "fix"
is the setting changed back."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until

SMALL = "1024"  # the "bug": a size limit that refuses a legitimate, larger message







def balances(dsn: str) -> dict[str, Decimal]:
    return {r["account_id"]: r["balance"] for r in stack.fetch(dsn, "SELECT * FROM accounts")}


def setup_bug(env: stack.Env, spawn_worker):  # type: ignore[no-untyped-def]
    """30 normal authorizations and one large one that the buggy setting dead-letters.
    Returns the transaction ids, the large one's id and account, and the stopped worker."""
    accounts = [f"ACC-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "1000.00", "EUR") for a in accounts]))
    txns = [f"OPS-{uuid.uuid4().hex[:12]}" for _ in range(30)]
    big_txn = f"BIG-{uuid.uuid4().hex[:12]}"
    big = auth_message(big_txn, account_id=accounts[0], amount="100.00",
                       merchant_address="x" * 1500)
    records = [(accounts[i % 3], encode(auth_message(t, account_id=accounts[i % 3],
                                                     amount="1.00")))
               for i, t in enumerate(txns)]
    records.insert(10, (accounts[0], encode(big)))
    stack.produce(env.input_topic, records)
    buggy = spawn_worker(env, "buggy", PAYAUTH_MAX_MESSAGE_BYTES=SMALL)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert buggy.metrics()['payauth_dead_letters_total{reason="TOO_LARGE"}'] == 1
    assert buggy.terminate() == 0
    wait_until(lambda: "active member" not in payauth(env, "replay", "--to-earliest").stderr,
               60, "the group to have no members")
    return txns, big_txn, accounts[0]


def test_replay_refuses_while_the_group_has_members(env, spawn_worker) -> None:
    stack.produce(env.input_topic, [(b"k", encode(auth_message()))])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    result = payauth(env, "replay", "--to-earliest", "--execute")
    assert result.returncode == 1
    assert "1 active member(s)" in result.stderr and "stop the workers" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert worker.terminate() == 0


def test_replay_after_a_fix_processes_the_dead_lettered_message_once(env, spawn_worker) -> None:
    txns, big_txn, big_account = setup_bug(env, spawn_worker)
    ends = stack.end_offsets(env.input_topic, env.partitions)
    before = balances(env.dsn)

    dry = payauth(env, "replay", "--to-earliest")
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout
    assert dry.stdout.strip().splitlines()[-1].split() == ["total", str(sum(ends.values()))]
    committed = stack.committed_offsets(env.group_id, env.input_topic, env.partitions)
    assert {p: committed[p] for p in ends if ends[p]} == {p: e for p, e in ends.items() if e}

    done = payauth(env, "replay", "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    committed = stack.committed_offsets(env.group_id, env.input_topic, env.partitions)
    assert all(o == 0 for p, o in committed.items() if ends[p] > 0), committed
    assert "committed offsets now" in done.stdout

    fixed = spawn_worker(env, "fixed")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    m = fixed.metrics()
    assert m['payauth_messages_total{outcome="approved"}'] == 1
    assert m['payauth_messages_total{outcome="duplicate"}'] == len(txns)
    after = balances(env.dsn)
    assert after[big_account] == before[big_account] - Decimal("100.00")
    assert {a: b for a, b in after.items() if a != big_account} == \
        {a: b for a, b in before.items() if a != big_account}
    ledger = stack.fetch(env.dsn, "SELECT txn_id FROM ledger_entries")
    assert sorted(r["txn_id"] for r in ledger) == sorted([*txns, big_txn])
    assert fixed.terminate() == 0


def test_replay_shift_by_and_partitions(env, spawn_worker) -> None:
    stack.produce(env.input_topic, [(b"k", encode(auth_message())) for _ in range(10)],
                  partition=1)
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0
    wait_until(lambda: "active member" not in payauth(env, "replay", "--shift-by", "-1").stderr,
               60, "the group to have no members")
    result = payauth(env, "replay", "--shift-by", "-3", "--partitions", "1", "--execute")
    assert result.returncode == 0, result.stderr
    assert stack.committed_offsets(env.group_id, env.input_topic, env.partitions)[1] == 7
    forward = payauth(env, "replay", "--shift-by", "2")
    assert forward.returncode == 1 and "skips messages forward" in forward.stderr


def test_replay_refuses_a_target_older_than_the_dedup_window(env, spawn_worker) -> None:
    three_hours_ago = int((time.time() - 3 * 3600) * 1000)
    producer = stack.producer()
    producer.produce(env.input_topic, key=b"k", value=encode(auth_message()),
                     timestamp=three_hours_ago, partition=0)
    assert producer.flush(10) == 0
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0
    wait_until(lambda: "active member" not in payauth(env, "replay", "--to-earliest").stderr,
               60, "the group to have no members")
    refused = payauth(env, "replay", "--to-earliest", PAYAUTH_DEDUP_RETENTION_HOURS="2")
    assert refused.returncode == 1
    assert "older than the dedup retention window of 2 h" in refused.stderr
    forced = payauth(env, "replay", "--to-earliest", "--force",
                     PAYAUTH_DEDUP_RETENTION_HOURS="2")
    assert forced.returncode == 0, forced.stderr
    allowed = payauth(env, "replay", "--to-earliest", PAYAUTH_DEDUP_RETENTION_HOURS="72")
    assert allowed.returncode == 0, allowed.stderr


def test_dlq_redrive_after_a_fix(env, spawn_worker) -> None:
    txns, big_txn, big_account = setup_bug(env, spawn_worker)
    dry = payauth(env, "dlq", "redrive", "--reason", "TOO_LARGE")
    assert dry.returncode == 0 and "would redrive" in dry.stdout and "TOO_LARGE" in dry.stdout
    assert dry.stdout.splitlines()[0].endswith("1 message(s)")
    assert payauth(env, "dlq", "redrive", "--reason", "INVALID_JSON").stdout \
        .splitlines()[0].endswith("0 message(s)")

    fixed = spawn_worker(env, "fixed")
    done = payauth(env, "dlq", "redrive", "--reason", "TOO_LARGE", "--execute")
    assert done.returncode == 0, done.stderr
    assert "redrove 1 message(s)" in done.stdout
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: fixed.metrics()['payauth_messages_total{outcome="approved"}'] == 1, 30,
               "the redriven message to be approved")
    redriven = [r for r in stack.read_topic(env.input_topic)
                if any(k == "redrive.source" for k, _ in (r.headers() or []))]
    assert len(redriven) == 1 and redriven[0].key() == big_account.encode()
    ledger = stack.fetch(env.dsn, "SELECT txn_id FROM ledger_entries")
    assert sorted(r["txn_id"] for r in ledger) == sorted([*txns, big_txn])
    # Redriving again is harmless: a duplicate.
    assert payauth(env, "dlq", "redrive", "--reason", "TOO_LARGE", "--execute").returncode == 0
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: fixed.metrics()['payauth_messages_total{outcome="duplicate"}'] >= 1, 30,
               "the second redrive to be a duplicate")
    assert len(stack.fetch(env.dsn, "SELECT 1 FROM ledger_entries")) == len(txns) + 1
    assert fixed.terminate() == 0


def test_purge_keeps_the_window_and_the_ledger_still_guards(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    old, new = f"OLD-{uuid.uuid4().hex[:10]}", f"NEW-{uuid.uuid4().hex[:10]}"
    messages = {t: auth_message(t, account_id=account, amount="10.00") for t in (old, new)}
    stack.produce(env.input_topic, [(account, encode(m)) for m in messages.values()])
    worker = spawn_worker(env, PAYAUTH_REDIS_URL="redis://127.0.0.1:1/0")  # no fast path
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = now() - interval '100 hours' WHERE txn_id = $1", old)

    aged, fresh = uuid.uuid4(), uuid.uuid4()  # publication receipts, purged by age too
    stack.fetch(env.dsn, "INSERT INTO published_batches VALUES "
                         "($1, now() - interval '100 hours'), ($2, now())", aged, fresh)

    result = payauth(env, "purge", "--batch-size", "1")
    assert result.returncode == 0, result.stderr
    assert "deleted 1 dedup record(s) older than 72 h" in result.stdout
    kept = [r["txn_id"] for r in stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")]
    assert kept == [new]
    receipts = {r["batch_id"]
                for r in stack.fetch(env.dsn, "SELECT batch_id FROM published_batches")}
    assert aged not in receipts and fresh in receipts
    # The record kept still counts as published: its batch's receipt was kept.
    assert stack.fetch(env.dsn, "SELECT 1 FROM processed_transactions p JOIN published_batches b "
                                "USING (batch_id) WHERE p.txn_id = $1", new)

    # The old transaction is redelivered after its dedup record is gone: the ledger's unique
    # txn_id still recognises it. No second debit.
    stack.produce(env.input_topic, [(account, encode(messages[old]))])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: worker.metrics()['payauth_duplicates_total{layer="postgres"}'] == 1, 30,
               "the redelivery to be a duplicate")
    assert stack.fetch(env.dsn, "SELECT balance FROM accounts")[0]["balance"] == Decimal("80.00")
    assert worker.terminate() == 0
