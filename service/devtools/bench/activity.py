"""The longest-running statement on a database, sampled each second while a load runs
(``make soak``): a statement that holds a core for seconds (a purge's plan compiled just in
time, a lock waited out) is named in the step it ran in, not only seen as that step's p99.

A sample reads ``pg_stat_activity``: how long the oldest active statement of the database
has been running, and its text. The longest seen since the last ``take`` is kept; a
statement shorter than the sampling interval may go unseen, which is the point: only what
runs for seconds matters here.
"""

from __future__ import annotations

import asyncio
import threading

import asyncpg

_OLDEST_ACTIVE = r"""
SELECT extract(epoch FROM clock_timestamp() - query_start)::float8 AS seconds,
       left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS query
  FROM pg_stat_activity
 WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
 ORDER BY query_start
 LIMIT 1
"""


class LongestStatement:
    """Samples ``dsn``'s database every ``every`` seconds on a thread of its own, from
    ``start`` until ``close``."""

    def __init__(self, dsn: str, every: float = 1.0) -> None:
        self._dsn = dsn
        self._every = every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._longest: tuple[float, str] = (0.0, "")
        self._thread = threading.Thread(target=self._run, name="longest-statement",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> tuple[float, str]:
        """The longest statement seen since the last call (seconds, text; 0 and '' if
        none), forgotten for the next."""
        with self._lock:
            longest, self._longest = self._longest, (0.0, "")
        return longest

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        conn: asyncpg.Connection | None = None
        try:
            while not self._stop.wait(self._every):
                try:
                    if conn is None or conn.is_closed():
                        conn = loop.run_until_complete(asyncpg.connect(self._dsn))
                    row = loop.run_until_complete(conn.fetchrow(_OLDEST_ACTIVE))
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    if conn is not None:  # (the database restarting: the next sample)
                        conn.terminate()
                    conn = None
                    continue
                if row is not None:
                    self._keep(float(row["seconds"]), str(row["query"]))
        finally:
            if conn is not None and not conn.is_closed():
                loop.run_until_complete(conn.close())
            loop.close()

    def _keep(self, seconds: float, query: str) -> None:
        with self._lock:
            if seconds > self._longest[0]:
                self._longest = (seconds, query)
