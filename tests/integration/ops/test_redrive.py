"""``payauth dlq redrive`` (``service/ops/redrive.py``) against the real broker and
database: after a bug fix, the dead letter re-published and decided once."""

from __future__ import annotations

from tests.support import stack
from tests.support.dead_letter_bug import setup_bug
from tests.support.workers import payauth, wait_caught_up, wait_until


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
