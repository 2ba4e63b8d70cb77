"""Retention of the PostgreSQL dedup store: delete records older than the window, in bounded
batches, each its own short transaction (no long locks, no bloat spike). The ledger is never
purged: its unique txn_id stays the last guard against a second debit."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import structlog

log = structlog.get_logger(__name__)

_DELETE_BATCH = """
DELETE FROM processed_transactions
 WHERE txn_id IN (SELECT txn_id FROM processed_transactions
                   WHERE processed_at < now() - make_interval(hours => $1)
                   ORDER BY processed_at
                   LIMIT $2
                     FOR UPDATE SKIP LOCKED)
"""

# Publication receipts of the same age: every record that relied on one is older still
# (processed before its batch was published), so it has been purged just before.
_DELETE_RECEIPTS = """
DELETE FROM published_batches
 WHERE batch_id IN (SELECT batch_id FROM published_batches
                     WHERE published_at < now() - make_interval(hours => $1)
                     ORDER BY published_at
                     LIMIT $2
                       FOR UPDATE SKIP LOCKED)
"""

# Only one replica purges at a time; the others skip the round.
_PURGE_LOCK = 0x7061_7970_7572_6765  # "paypurge"


async def purge(
    conn: asyncpg.Connection,
    *,
    retention_hours: int,
    batch_size: int = 5_000,
    max_batches: int | None = None,
    pause_seconds: float = 0.0,
) -> int:
    """Delete expired dedup records; return how many. Safe to run from several places."""
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _PURGE_LOCK):
        log.info("purge_skipped", reason="another purge is running")
        return 0
    total = 0
    receipts = 0
    batches = 0
    started = time.monotonic()
    try:
        while max_batches is None or batches < max_batches:
            status = await conn.execute(_DELETE_BATCH, retention_hours, batch_size)
            deleted = int(status.split()[-1])
            total += deleted
            batches += 1
            if deleted:
                log.info("purge_progress", deleted=total, batches=batches)
            if deleted < batch_size:
                break
            if pause_seconds:  # let the worker's own transactions breathe between batches
                await asyncio.sleep(pause_seconds)
        while max_batches is None or batches < max_batches:
            status = await conn.execute(_DELETE_RECEIPTS, retention_hours, batch_size)
            receipts += int(status.split()[-1])
            batches += 1
            if int(status.split()[-1]) < batch_size:
                break
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _PURGE_LOCK)
    log.info("purge_done", deleted=total, receipts_deleted=receipts, batches=batches,
             seconds=round(time.monotonic() - started, 3), retention_hours=retention_hours)
    return total
