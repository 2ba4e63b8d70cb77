"""Expiry among the faults: ``payauth holds expire --execute`` every few seconds while the
chaos run's faults strike, two runs at once now and then, with the workers' settings (so
through the same proxy to PostgreSQL, meeting its pauses and cuts) and a short
``PAYAUTH_HOLD_EXPIRY_HOURS``, so that holds expire while their reversals and clearings are
still coming.

A run that meets a fault may fail (exit 1, or killed past its bound): the holds it ended
keep their ``HoldExpired`` in the outbox. ``drain()``, once the run is over, publishes them
with an expiry too long to end anything more, so that the checker may ask for one event
per expired hold, and holds still active stay as the log left them.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from service.devtools.processes import ROOT

_ENDED = re.compile(r"holds expire: (\d+) hold\(s\) expired")
RUN_BOUND_SECONDS = 120.0


class ExpiryRuns:
    def __init__(self, env: dict[str, str], log_dir: Path, seed: int, *,
                 every: tuple[float, float] = (4.0, 10.0), both: float = 0.3) -> None:
        self._env = env
        self._dir = log_dir
        self._rng = random.Random(seed)
        self._every = every
        self._both = both
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()
        self._n = 0
        self.outcomes: Counter[str] = Counter()  # "exit 0", "exit 1", "killed"
        self.ended = 0       # holds ended, as runs that exited 0 said (a failed one says none)
        self.concurrent = 0  # times two ran at once

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._rng.uniform(*self._every)):
            runs = 2 if self._rng.random() < self._both else 1
            if runs == 2:
                self.concurrent += 1
            threads = [threading.Thread(target=self.run_once) for _ in range(runs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def run_once(self, **overrides: str) -> int:
        with self._lock:
            self._n += 1
            out = self._dir / f"holds-expire-{self._n}.log"
            self._dir.mkdir(parents=True, exist_ok=True)
        try:
            result = subprocess.run(
                [sys.executable, "-m", "service", "holds", "expire", "--execute"],
                cwd=ROOT, env={**self._env, **overrides}, capture_output=True, text=True,
                timeout=RUN_BOUND_SECONDS)
        except subprocess.TimeoutExpired as exc:  # subprocess.run killed it
            printed = exc.stdout.decode() if isinstance(exc.stdout, bytes) else ""
            out.write_text(f"killed after {RUN_BOUND_SECONDS:.0f} s\n{printed}")
            self._count(overrides, "killed", 0)
            return -9
        out.write_text(result.stdout + result.stderr)
        self._count(overrides, f"exit {result.returncode}",
                    sum(int(n) for n in _ENDED.findall(result.stdout)))
        return result.returncode

    def _count(self, overrides: dict[str, str], outcome: str, ended: int) -> None:
        if overrides:  # the drain: not one of the runs among the faults
            return
        with self._lock:
            self.outcomes[outcome] += 1
            self.ended += ended

    def drain(self) -> int:
        """Publish what earlier runs left in the outbox, ending nothing more."""
        return self.run_once(PAYAUTH_HOLD_EXPIRY_HOURS="1000000")
