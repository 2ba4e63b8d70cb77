"""The dedup store's purge among the chaos run's faults, and the shadow replay at its end.

``payauth purge`` runs as an operator (or the worker's periodic purge) would, with the run's
retention window of minutes (``PAYAUTH_DEDUP_RETENTION_HOURS``), so that late redeliveries,
reversals and clearings meet transactions whose dedup records are gone, and the shadow
replay meets messages it can only judge from where their effects are kept.

The run's dedup store has periods of half its window (``dedup_period_seconds``): the purge
drops whole periods, as at a bank's, and deletes row by row only what no period takes whole.

Before each purge, the records it may delete are read (those past a window 30 s shorter: a
superset of what the purge, which follows within seconds, deletes): the checker holds them
to everything a record still in the database is held to.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

from service.devtools.processes import ROOT

_DELETED = re.compile(r"purge: deleted (\d+) dedup record")
_SNAPSHOT = """
SELECT txn_id, result, decline_reason, fingerprint, source_partition, source_offset,
       input_card_status,
       processed_at
  FROM processed_transactions
 WHERE processed_at < now() - $1::float8 * interval '1 second'
"""
_MARGIN_SECONDS = 30.0


def dedup_period_seconds(retention_seconds: float) -> int:
    """The dedup store's period for a run's window of minutes: half the window (a minute at
    least, the store's shortest), so that the purge drops whole periods during the run."""
    return max(60, int(retention_seconds // 2))
RUN_BOUND_SECONDS = 120.0


class Purges:
    def __init__(self, dsn: str, env: dict[str, str], retention_seconds: float,
                 log_dir: Path) -> None:
        self._dsn = dsn
        self.env = env  # the workers' settings, the database reached directly
        self._retention = retention_seconds
        self._dir = log_dir
        self.snapshot: dict[str, dict[str, Any]] = {}  # txn_id -> its record, as read
        self.deleted = 0
        self._n = 0

    def run_once(self) -> int:
        """Read what may go, then ``payauth purge``; its exit status."""
        import asyncio

        rows = asyncio.run(self._read(max(0.0, self._retention - _MARGIN_SECONDS)))
        for row in rows:
            self.snapshot.setdefault(row["txn_id"], dict(row))
        self._n += 1
        self._dir.mkdir(parents=True, exist_ok=True)
        with (self._dir / f"purge-{self._n}.log").open("w") as out:
            done = subprocess.run([sys.executable, "-m", "service", "purge"], cwd=ROOT,
                                  env=self.env, stdout=subprocess.PIPE, stderr=out,
                                  text=True, timeout=RUN_BOUND_SECONDS)
            out.write(done.stdout)
        found = _DELETED.search(done.stdout)
        if found:
            self.deleted += int(found.group(1))
        return done.returncode

    async def _read(self, older_than_seconds: float) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(self._dsn)
        try:
            return list(await conn.fetch(_SNAPSHOT, older_than_seconds))
        finally:
            await conn.close()


def shadow_replay(env: dict[str, str], report: Path) -> int:
    """``payauth replay --shadow --to-earliest`` with the run's settings: exit 0 when
    deciding the whole input again with the code as it is changes nothing."""
    done = subprocess.run([sys.executable, "-m", "service", "replay", "--shadow",
                           "--to-earliest"], cwd=ROOT,
                          env={**env, "PAYAUTH_LOG_LEVEL": "WARNING"}, capture_output=True,
                          text=True, timeout=600)
    report.write_text(done.stdout + done.stderr)
    return done.returncode
