"""Worker processes for the tests: the real ``payauth run``, started, observed and killed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from service.adapters.kafka.admin import COORDINATOR_NOT_READY
from service.devtools.processes import WorkerProcess as _WorkerProcess
from service.devtools.processes import parse_metrics
from tests.support.stack import ROOT, Env, committed_offsets, end_offsets

__all__ = ["WorkerProcess", "parse_metrics", "payauth", "wait_caught_up", "wait_until"]


def payauth(env: Env, *args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    """``payauth ARGS`` as an operator runs it against the test's world (warnings only)."""
    return subprocess.run([sys.executable, "-m", "service", *args], cwd=ROOT,
                          env={**env.worker_env(**overrides),
                               "PAYAUTH_LOG_LEVEL": overrides.get("PAYAUTH_LOG_LEVEL",
                                                                  "WARNING")},
                          capture_output=True, text=True, timeout=180)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class WorkerProcess(_WorkerProcess):
    def wait_assigned(self, timeout: float = 60) -> None:
        wait_until(lambda: self.events("partitions_assigned"), timeout, "partition assignment")


def wait_caught_up(group_id: str, topic: str, partitions: int, timeout: float = 120) -> None:
    """Until the group's committed offsets reach the end of every partition (lag zero)."""
    def caught_up() -> bool:
        try:
            ends = end_offsets(topic, partitions)
            committed = committed_offsets(group_id, topic, partitions)
        except KafkaException as exc:
            if exc.args[0].code() in COORDINATOR_NOT_READY:
                return False  # a coordinator moving or loading: ask again
            raise
        return all(end == 0 or committed.get(p, -1) >= end for p, end in ends.items())

    wait_until(caught_up, timeout, f"group {group_id} to commit every offset", interval=0.5)
