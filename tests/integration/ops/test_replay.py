"""``payauth replay`` (``service/ops/replay.py``) against the real broker and database:
after a bug fix, the dead-lettered message is processed once; the refusals. Its flags:
tests/unit/ops/test_replay.py."""

from __future__ import annotations

import time
from decimal import Decimal

from tests.support import stack
from tests.support.dead_letter_bug import balances, setup_bug
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until


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
