"""The benchmark's purge phase: a dedup store holding records past the window (and the
window's own beside them), then ``payauth purge`` (the retention adapter, as the command
runs it) timed; the phase compares its time for ten times the records, and a backlog
decided while it runs against the same backlog alone.

The records past the window are written as five days of a store would have left them:
each in the partition of its own day (the partitions ``payauth_dedup_prepare`` made on
those days, made here after the fact), its processed_at within that day, vacuumed and
analyzed as autovacuum would have long done, and checkpointed. (The bench's role is the
database's owner, a superuser on the local stack: CHECKPOINT needs one.)
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import asyncpg

from service.adapters import retention

DAYS_PAST = 5  # the days the records past the window are spread over, the oldest 10 ago
WINDOW_HOURS = 72.0

_PARTITION = """
CREATE TABLE IF NOT EXISTS {name} PARTITION OF processed_transactions
    FOR VALUES FROM ('{start}') TO ('{end}')
"""
# One day's records: purchases of the bench's accounts, approved, each a distinct key.
_FILL = """
INSERT INTO processed_transactions
       (txn_id, dedup_period, processed_at, result, fingerprint, account_id, amount, currency,
        authorization_type, published_at)
SELECT $1 || g, $2::timestamptz, $2::timestamptz + (g % 86400) * interval '1 second',
       'APPROVED', md5(g::text), 'BENCH-' || lpad((g % 10000)::text, 6, '0'), 1 + g % 100,
       'EUR', 'PURCHASE', $2::timestamptz + (g % 86400) * interval '1 second'
  FROM generate_series(1, $3) AS g
"""


async def fill_past(dsn: str, records: int, tag: str) -> None:
    """``records`` past the window, spread over ``DAYS_PAST`` days ending 6 days ago."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    conn = await asyncpg.connect(dsn)
    try:
        for k in range(DAYS_PAST):
            start = today - timedelta(days=10 - k)
            name = f"processed_transactions_{start:%Y%m%d_%H%M%S}"
            await conn.execute(_PARTITION.format(name=name, start=start.isoformat(),
                                                 end=(start + timedelta(days=1)).isoformat()))
            await conn.execute(_FILL, f"{tag}{k}-", start, records // DAYS_PAST)
            await conn.execute(f"VACUUM (ANALYZE) {name}")
        # (Written to disk, as days-old records are: the checkpoint after a fill would
        # otherwise weigh on the next phase, not on the purge.)
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


async def timed_purge(dsn: str) -> tuple[float, float, int]:
    """``payauth purge`` with a 72 h window: its seconds, those of them the file system took
    to free the dropped partitions' files, and the records it removed."""
    conn = await asyncpg.connect(dsn)
    try:
        times = retention.PurgeTimes()
        started = time.perf_counter()
        removed = await retention.purge(conn, retention_hours=WINDOW_HOURS, times=times)
        return time.perf_counter() - started, times.files_freed_seconds, removed
    finally:
        await conn.close()
