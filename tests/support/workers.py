"""Worker processes for the tests: the real ``payauth run``, started, observed and killed."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.stack import ROOT, committed_offsets, end_offsets


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


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def parse_metrics(text: str) -> dict[str, float]:
    """'name{labels}' → value, for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


class WorkerProcess:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service", "run"], cwd=ROOT, env=self.env,
            stdout=log, stderr=subprocess.STDOUT,
        )
        return self

    def logs(self) -> list[dict[str, Any]]:
        out = []
        if not self.log_path.exists():
            return out
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def raw_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    @property
    def metrics_port(self) -> int:
        started = wait_until(lambda: self.events("worker_starting"), 30, "worker start")
        return int(started[-1]["metrics_port"])

    def http_get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.http_get("/metrics")[1])

    def wait_assigned(self, timeout: float = 60) -> None:
        wait_until(lambda: self.events("partitions_assigned"), timeout, "partition assignment")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)


def wait_caught_up(group_id: str, topic: str, partitions: int, timeout: float = 120) -> None:
    """Until the group's committed offsets reach the end of every partition (lag zero)."""
    def caught_up() -> bool:
        ends = end_offsets(topic, partitions)
        committed = committed_offsets(group_id, topic, partitions)
        return all(end == 0 or committed.get(p, -1) >= end for p, end in ends.items())

    wait_until(caught_up, timeout, f"group {group_id} to commit every offset", interval=0.5)
