"""The chaos checker against real runs: it passes a correct run with a crash in it, and one
with lifecycles and expiry runs (two at once) among them; and it catches a planted loss
(the negative control: a worker that writes the Redis key before the database COMMIT and
dies in between), a reversal's release applied twice and a hold ended twice (negative
controls: each written behind the decision function's back into a correct run's
database), and an event whose delta was dropped (the run's own events, one changed)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from pathlib import Path

import asyncpg
from pydantic import SecretStr

from service.config import Settings
from service.devtools.chaos.checker import Report, check, read_all, read_log
from service.devtools.chaos.expiry import ExpiryRuns
from service.devtools.chaos.generator import LoadGenerator, seed_accounts
from service.devtools.chaos.rebuild import rebuilt_from_events
from tests.support import stack
from tests.support.workers import wait_caught_up


def settings_for(env: stack.Env) -> Settings:
    return Settings(kafka_bootstrap_servers=stack.BOOTSTRAP, group_id=env.group_id,
                    input_topic=env.input_topic, output_topic=env.output_topic,
                    dlq_topic=env.dlq_topic, database_url=SecretStr(env.dsn),
                    redis_url=SecretStr(env.redis_url))


def generate(env: stack.Env, run: str, log: Path, seconds: float = 2.0,
             lifecycle_share: float = 0.08) -> LoadGenerator:
    accounts = asyncio.run(seed_accounts(env.dsn, run, n_rich=10))
    generator = LoadGenerator(bootstrap=stack.BOOTSTRAP, topic=env.input_topic,
                              partitions=env.partitions, run=run, accounts=accounts,
                              log_path=log, seed=3, late_after_seconds=0.5,
                              lifecycle_share=lifecycle_share, lifecycle_span=2.0)
    generator.run(seconds=seconds, rate=150)
    generator.close()
    assert not generator.failed
    return generator


EXPIRY_HOURS = 0.0002  # 0.72 s: holds expire while their lifecycles are still coming


def lifecycle_run(env: stack.Env, spawn_worker, tmp_path: Path, *,
                  expiry: bool) -> tuple[Path, str]:
    """A correct run with many lifecycles; with ``expiry``, holds expire runs (two at
    once, then one) while the load still comes, and a last one publishes the outbox."""
    run = uuid.uuid4().hex[:6]
    log = tmp_path / "truth.jsonl"
    worker = spawn_worker(env, "lifecycles", PAYAUTH_HOLD_EXPIRY_HOURS=str(EXPIRY_HOURS))
    load = threading.Thread(target=generate, args=(env, run, log),
                            kwargs={"seconds": 3.0, "lifecycle_share": 0.4})
    load.start()
    runs = ExpiryRuns(env.worker_env(PAYAUTH_HOLD_EXPIRY_HOURS=str(EXPIRY_HOURS)),
                      tmp_path / "expiry", seed=1)
    if expiry:
        time.sleep(1.5)
        both = [threading.Thread(target=runs.run_once) for _ in range(2)]
        for t in both:
            t.start()
        for t in both:
            t.join()
        time.sleep(1.0)
        assert runs.run_once() == 0
    load.join()
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    if expiry:
        assert runs.drain() == 0
        assert runs.outcomes == {"exit 0": 3}, runs.outcomes
    assert worker.terminate() == 0
    return log, run


def failed(report: Report) -> dict[str, list[str]]:
    return {f.name: f.violations for f in report.findings if not f.ok}


BALANCES = "every account's balance, held and available are what the log implies " \
    "(account_balances)"
HOLDS = "every hold is what the log implies and ends at most once (expiries from the " \
    "database)"


def test_checker_passes_a_correct_run_with_a_crash(env, spawn_worker, tmp_path) -> None:
    run = uuid.uuid4().hex[:6]
    log = tmp_path / "truth.jsonl"
    generate(env, run, log)
    doomed = spawn_worker(env, "doomed", PAYAUTH_TEST_FAULT_POINT="after_db_commit")
    assert doomed.wait_exit(60) == -signal.SIGKILL
    worker = spawn_worker(env, "survivor")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0

    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-")
    assert report.ok, report.render()
    sent = read_log(log)
    assert sum(report.accounted.values()) == len(sent)
    assert report.accounted["duplicate"] > 0 and report.accounted["dead-lettered"] > 0
    assert report.accounted["approved"] > 0 and report.accounted["declined"] > 0


def test_checker_catches_the_loss_a_wrong_commit_order_causes(env, spawn_worker,
                                                             tmp_path) -> None:
    run = uuid.uuid4().hex[:6]
    log = tmp_path / "truth.jsonl"
    generate(env, run, log, seconds=1.0)
    # Negative control: Redis key written BEFORE the COMMIT, then a crash in between.
    wrong = spawn_worker(env, "wrong", PAYAUTH_TEST_UNSAFE_ORDERING="redis_before_commit",
                         PAYAUTH_TEST_FAULT_POINT="before_db_commit")
    assert wrong.wait_exit(60) == -signal.SIGKILL
    worker = spawn_worker(env, "next")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0

    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-")
    assert not report.ok
    failed = {f.name: f for f in report.findings if not f.ok}
    accounting = failed["every message sent is accounted for exactly once"]
    assert any("LOST" in v for v in accounting.violations), accounting.violations[:3]
    assert "each transaction decided once, as expected, on its first payload" in failed
    assert any("never decided" in v for v in failed[
        "each transaction decided once, as expected, on its first payload"].violations)
    assert "every Redis dedup key has a committed database row" in failed


def test_the_same_crash_point_is_harmless_with_the_right_order(env, spawn_worker,
                                                               tmp_path) -> None:
    run = uuid.uuid4().hex[:6]
    log = tmp_path / "truth.jsonl"
    generate(env, run, log, seconds=1.0)
    doomed = spawn_worker(env, "doomed", PAYAUTH_TEST_FAULT_POINT="before_db_commit")
    assert doomed.wait_exit(60) == -signal.SIGKILL
    worker = spawn_worker(env, "next")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.terminate() == 0
    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-")
    assert report.ok, report.render()


def test_a_transaction_rolled_back_on_purpose_is_retried(env, spawn_worker, tmp_path) -> None:
    run = uuid.uuid4().hex[:6]
    log = tmp_path / "truth.jsonl"
    generate(env, run, log, seconds=1.0)
    worker = spawn_worker(env, PAYAUTH_TEST_FAULT_POINT="rollback_once")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.metrics()['payauth_retries_total{cause="transient"}'] >= 1
    assert worker.terminate() == 0
    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-")
    assert report.ok, report.render()


def test_checker_passes_lifecycles_with_expiry_runs_among_them(env, spawn_worker,
                                                              tmp_path) -> None:
    log, run = lifecycle_run(env, spawn_worker, tmp_path, expiry=True)
    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-",
                   hold_expiry_hours=EXPIRY_HOURS)
    assert report.ok, report.render()
    stats = report.lifecycle
    assert stats["lifecycle messages decided"] > 50, stats
    for end in ("holds expired", "holds reversed", "holds cleared"):
        assert stats[end] > 0, stats
    assert sum(report.accounted.values()) == len(read_log(log))
    # reversals of purchases sent before them (credited when the purchase arrives) among them
    assert any(m["kind"] == "lc_orphan_purchase_reversal" for m in read_log(log))


async def _plant(dsn: str, sql: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            return str(await conn.fetchval(sql))
    finally:
        await conn.close()


# What a reversal released, released once more: the hold and its account's held amount
# lowered again, as a release applied twice (a redelivery decided anew) would leave them.
# A run's few partial reversals of holds still active (2 to 5 in 3 s of load) may be none
# on a loaded host: then an active hold loses half of what it holds, as a second release
# of a reversal the log does not have; the checker sees the same disagreement.
_RELEASE_AGAIN = """
WITH released AS (
    SELECT m.original_txn_id AS hold, m.amount_applied AS amount
      FROM lifecycle_messages m WHERE m.kind = 'REVERSAL' AND m.amount_applied > 0
    UNION ALL
    SELECT o.original_txn_id, o.applied FROM orphan_reversals o
     WHERE o.state = 'APPLIED' AND o.applied > 0
), victim AS (
    SELECT h.txn_id, h.account_id, coalesce(r.amount, round(h.remaining / 2, 2)) AS amount
      FROM holds h LEFT JOIN released r ON r.hold = h.txn_id AND h.remaining > r.amount
     WHERE h.state = 'ACTIVE' AND h.remaining > 0.01
     ORDER BY r.hold IS NULL, h.txn_id LIMIT 1
), hold AS (
    UPDATE holds h SET remaining = h.remaining - v.amount FROM victim v
     WHERE h.txn_id = v.txn_id RETURNING h.txn_id
), account AS (
    UPDATE accounts a SET held = a.held - v.amount FROM victim v
     WHERE a.account_id = v.account_id RETURNING 1
)
SELECT (SELECT txn_id FROM hold) FROM account
"""

# A hold a clearing ended, ended again by an expiry (what an expiry that did not find the
# hold ended would write).
_END_AGAIN = """
UPDATE holds SET state = 'EXPIRED', ended_by = NULL
 WHERE txn_id = (SELECT txn_id FROM holds WHERE state = 'CLEARED' ORDER BY txn_id LIMIT 1)
RETURNING txn_id
"""


def test_negative_control_a_reversal_applied_twice_is_reported(env, spawn_worker,
                                                               tmp_path) -> None:
    log, run = lifecycle_run(env, spawn_worker, tmp_path, expiry=False)
    assert check(settings_for(env), log, redis_prefix=f"CH-{run}-").ok
    hold = asyncio.run(_plant(env.dsn, _RELEASE_AGAIN))
    assert hold.startswith(f"CH-{run}-"), hold
    wrong = failed(check(settings_for(env), log, redis_prefix=f"CH-{run}-"))
    assert any(v.startswith(f"{hold}: amount/incremented/remaining") for v in wrong[HOLDS]), wrong
    assert len(wrong[BALANCES]) == 1, wrong


def test_negative_control_a_hold_ended_twice_is_reported(env, spawn_worker, tmp_path) -> None:
    log, run = lifecycle_run(env, spawn_worker, tmp_path, expiry=False)
    assert check(settings_for(env), log, redis_prefix=f"CH-{run}-").ok
    hold = asyncio.run(_plant(env.dsn, _END_AGAIN))
    assert hold.startswith(f"CH-{run}-"), hold
    wrong = failed(check(settings_for(env), log, redis_prefix=f"CH-{run}-"))
    assert any(v.startswith(f"{hold}: expired, and ended by") for v in wrong[HOLDS]), wrong


def test_negative_control_an_event_whose_delta_was_dropped_is_caught(env, spawn_worker,
                                                                     tmp_path) -> None:
    """The events of a correct lifecycle run (expiries and orphans among them) rebuild every
    balance and held amount; the same events with one delta dropped do not, and the account
    it belongs to is named."""
    log, run = lifecycle_run(env, spawn_worker, tmp_path, expiry=True)
    report = check(settings_for(env), log, redis_prefix=f"CH-{run}-")
    assert report.ok, report.render()
    events = [json.loads(r.value()) for r in read_all(settings_for(env), env.output_topic)]
    kinds = {e["event_type"] for e in events}
    assert {"PaymentAuthorized", "PaymentReversed", "PaymentCleared", "HoldExpired"} <= kinds
    accounts = asyncio.run(_balances(env.dsn))
    assert rebuilt_from_events(events, accounts).ok
    for field in ("balance_delta", "held_delta"):
        victim = next(e for e in events if e[field] not in ("0.00", "0"))
        dropped = [{**e, field: "0.00"} if e is victim else e for e in events
                   if e["event_id"] != victim["event_id"] or e is victim]
        finding = rebuilt_from_events(dropped, accounts)
        assert [v.split(":")[0] for v in finding.violations] == [victim["account_id"]], field


async def _balances(dsn: str) -> dict[str, asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["account_id"]: r for r in await conn.fetch(
            "SELECT b.account_id, a.opening_balance, b.balance, b.held "
            "FROM account_balances b JOIN accounts a USING (account_id)")}
    finally:
        await conn.close()
