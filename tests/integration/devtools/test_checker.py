"""The chaos checker against real runs: it passes a correct run with a crash in it, and it
catches a planted loss (the negative control: a worker that writes the Redis key before the
database COMMIT and dies in between)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

from pydantic import SecretStr

from service.config import Settings
from service.devtools.chaos.checker import check, read_log
from service.devtools.chaos.generator import LoadGenerator, seed_accounts
from tests.support import stack
from tests.support.workers import wait_caught_up


def settings_for(env: stack.Env) -> Settings:
    return Settings(kafka_bootstrap_servers=stack.BOOTSTRAP, group_id=env.group_id,
                    input_topic=env.input_topic, output_topic=env.output_topic,
                    dlq_topic=env.dlq_topic, database_url=SecretStr(env.dsn),
                    redis_url=SecretStr(env.redis_url))


def generate(env: stack.Env, run: str, log: Path, seconds: float = 2.0) -> LoadGenerator:
    accounts = asyncio.run(seed_accounts(env.dsn, run, n_rich=10))
    generator = LoadGenerator(bootstrap=stack.BOOTSTRAP, topic=env.input_topic,
                              partitions=env.partitions, run=run, accounts=accounts,
                              log_path=log, seed=3, late_after_seconds=0.5)
    generator.run(seconds=seconds, rate=150)
    generator.close()
    assert not generator.failed
    return generator


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
