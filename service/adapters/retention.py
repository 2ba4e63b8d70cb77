"""Retention of the PostgreSQL dedup store. The store is partitioned by period (a UTC day
unless it was made with another length, ``payauth_dedup_set_period``): a period past the
window goes whole, its partition detached (``payauth_dedup_drop_period``: no row deleted,
no vacuum, no bloat; the store locked for a moment) then dropped outside the store
(``payauth_dedup_drop_purged``: the file system frees it while claims go on); the spending
limits' charges counted in the periods gone likewise, their partitions detached in a
transaction of their own (``payauth_limit_charges_drop_periods``) and summed as they are
dropped. Only what no period holds whole is deleted row by row, in bounded batches, each
its own short transaction: records an administrator set before their own period, and the
default partition's. The partitions of the periods ahead are made first
(``payauth_dedup_prepare``). The ledger is never purged: its unique txn_id stays the last
guard against a second debit. Run by ``payauth purge`` (``service/ops/purge.py``) and by
the worker now and then (``PAYAUTH_PURGE_INTERVAL_SECONDS``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg
import structlog

log = structlog.get_logger(__name__)


def _delete_expired(table: str, key: str, age: str) -> str:
    """One bounded batch of ``table``'s rows older than the window ($1 hours, fractions
    allowed; $2 rows); the names are this module's constants, never input. (Rows nobody but
    the purge locks, and one purge at a time: no FOR UPDATE, which the worker's role may
    not ask of a table it cannot update.)"""
    return f"""
DELETE FROM {table}
 WHERE {key} IN (SELECT {key} FROM {table}
                  WHERE {age} < now() - $1::float8 * interval '1 hour'
                  ORDER BY {age}
                  LIMIT $2)
"""


# The spending limits' charges kept under a purge's batch of records (``batch``: what a
# reversal of that purchase or hold would give back) go with them, but a standing hold's:
# a reversal gives back what it releases of a hold whatever the hold's age, so those go
# with the period under way instead (as payauth_limit_charges_drop_periods keeps them).
# What the charges that go counted is kept (a trigger: sql/payauth_limit_charges_purged.sql).
# (A data-modifying WITH runs whether or not it is read.)
_BATCH_CHARGES = """kept AS (
    UPDATE limit_charges c SET dedup_period = payauth_dedup_period(payauth_dedup_clock())
      FROM batch b
     WHERE c.txn_id = b.txn_id
       AND EXISTS (SELECT 1 FROM holds h WHERE h.txn_id = c.txn_id AND h.state = 'ACTIVE')
), charges AS (
    DELETE FROM limit_charges c USING batch b
     WHERE c.txn_id = b.txn_id
       AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.txn_id = c.txn_id AND h.state = 'ACTIVE')
)"""


# Records past the window that no period takes whole, with their charges (_BATCH_CHARGES;
# a reversal after the window finds no record of its purchase, and gives nothing back).
# The records set before their own period (the partial index processed_transactions_set_
# back_idx holds them, and only them: its predicate is written here the same way)...
_DELETE_SET_BACK = f"""
WITH batch AS (
    SELECT txn_id, dedup_period FROM processed_transactions
     WHERE processed_at < now() - $1::float8 * interval '1 hour'
       AND processed_at < dedup_period
     ORDER BY processed_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), {_BATCH_CHARGES}
DELETE FROM processed_transactions p USING batch b
 WHERE p.txn_id = b.txn_id AND p.dedup_period = b.dedup_period
"""
# ... and the default partition's (kept there for want of their period's partition).
_DELETE_DEFAULT = f"""
WITH batch AS (
    SELECT txn_id FROM processed_transactions_default
     WHERE processed_at < now() - $1::float8 * interval '1 hour'
     ORDER BY processed_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), {_BATCH_CHARGES}
DELETE FROM processed_transactions_default p USING batch b WHERE p.txn_id = b.txn_id
"""
# Publication receipts of the same age: every record that relied on one is older still
# (processed before its batch was published), so it has been purged just before.
_DELETE_RECEIPTS = _delete_expired("published_batches", "batch_id", "published_at")
# Duplicate sightings (rows per batch, no key of their own: the row's ctid), same window.
_DELETE_SIGHTINGS = _delete_expired("duplicate_sightings", "ctid", "seen_at")

# Who holds the dedup store now, for a drop that could not wait them out: how many sessions,
# and how long the oldest one's transaction has run (idle in transaction: a client gone
# quiet mid-transaction, until its connection is found dead).
_STORE_HOLDERS = """
SELECT count(DISTINCT l.pid) AS n,
       round(extract(epoch FROM now() - min(a.xact_start))::numeric, 1)::float8 AS oldest
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.relation = 'processed_transactions'::regclass AND l.granted
   AND l.pid <> pg_backend_pid()
"""

@dataclass
class PurgeTimes:
    """Where a purge's time went, for whoever asks (the benchmark): the seconds spent
    dropping the detached partitions, the file system freeing their files (the one part
    that grows with the records a period held)."""

    files_freed_seconds: float = 0.0


# Only one replica purges at a time; the others skip the round.
_PURGE_LOCK = 0x7061_7970_7572_6765  # "paypurge"
# A row-by-row batch chosen to end a deadlock is taken again this many times in all, a
# pause growing by this much between tries.
_BATCH_ATTEMPTS = 5
_BATCH_RETRY_PAUSE = 0.2


async def purge(
    conn: asyncpg.Connection,
    *,
    retention_hours: float,
    batch_size: int = 5_000,
    max_batches: int | None = None,
    pause_seconds: float = 0.0,
    times: PurgeTimes | None = None,
) -> int:
    """Purge the dedup records older than the window; return how many went (``times``, if
    given, says where the time went). Safe to run from several places."""
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", _PURGE_LOCK):
        log.info("purge_skipped", reason="another purge is running")
        return 0
    # No JIT compilation, as for the worker's batches: each statement touches a batch of
    # rows, but the row-by-row ones are costed far above that (their data-modifying WITHs
    # join the charges of every period), and PostgreSQL compiled them, inlined and
    # optimized, for seconds of CPU at every purge.
    await conn.execute("SET jit = off")
    batches = 0
    started = time.monotonic()
    times = times if times is not None else PurgeTimes()

    async def one_batch(statement: str, table: str) -> str:
        # A batch that deadlocked with a claim (over a limit's charge, a record) is rolled
        # back whole and taken again: the claim went on, and the purge is not left to the
        # next round for a wait a retry ends.
        for attempt in range(1, _BATCH_ATTEMPTS + 1):
            try:
                return str(await conn.execute(statement, retention_hours, batch_size))
            except asyncpg.DeadlockDetectedError as error:
                if attempt == _BATCH_ATTEMPTS:
                    raise
                log.warning("purge_batch_retried", table=table, attempt=attempt,
                            error=str(error))
                await asyncio.sleep(_BATCH_RETRY_PAUSE * attempt)
        raise AssertionError("unreachable")

    async def delete_expired(statement: str, table: str, pause: float) -> int:
        nonlocal batches
        total = 0
        while max_batches is None or batches < max_batches:
            status = await one_batch(statement, table)
            deleted = int(status.split()[-1])
            total += deleted
            batches += 1
            if deleted:
                log.info("purge_progress", table=table, deleted=total, batches=batches)
            if deleted < batch_size:
                break
            if pause:  # let the worker's own transactions breathe between batches
                await asyncio.sleep(pause)
        return total

    try:
        try:
            await prepare_periods(conn)
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as error:
            log.warning("dedup_periods_deferred", error=str(error))  # made by the next one
        times.files_freed_seconds += await _drop_purged(conn)
        dropped = await _drop_expired_periods(conn, retention_hours, times)
        await _drop_charges_of_periods_gone(conn)
        times.files_freed_seconds += await _drop_purged(conn)
        total = dropped + await delete_expired(_DELETE_SET_BACK, "processed_transactions",
                                               pause_seconds)
        total += await delete_expired(_DELETE_DEFAULT, "processed_transactions_default",
                                      pause_seconds)
        receipts = await delete_expired(_DELETE_RECEIPTS, "published_batches", 0.0)
        await delete_expired(_DELETE_SIGHTINGS, "duplicate_sightings", 0.0)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _PURGE_LOCK)
    log.info("purge_done", deleted=total, dropped_with_their_periods=dropped,
             receipts_deleted=receipts, batches=batches,
             seconds=round(time.monotonic() - started, 3),
             files_freed_seconds=round(times.files_freed_seconds, 3),
             retention_hours=retention_hours)
    return total


async def prepare_periods(
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> list[str]:
    """Make the partitions of the period under way and the ones ahead where missing, the
    dedup store's then the limits' charges', each in a transaction of its own (one never
    waits holding the other's default partition); return the ones made."""
    made = [r[0] for table in ("processed_transactions", "limit_charges")
            for r in await conn.fetch("SELECT * FROM payauth_dedup_prepare(p_table => $1)",
                                      table)]
    if made:
        log.info("dedup_periods_made", partitions=made)
    return made


async def _drop_expired_periods(conn: asyncpg.Connection, retention_hours: float,
                                times: PurgeTimes, attempts: int = 5) -> int:
    """Drop every period past the window, oldest first, one a transaction; return the
    records that went with them. A drop that could not go on (it waited its lock_timeout
    out while a transaction held the table, it was chosen to end a deadlock with a claim
    over a charge, or a record within the window came into its period meanwhile) is rolled
    back whole and tried again a second later, ``attempts`` times in all, then left to the
    next purge."""
    total = 0
    busy = 0
    while True:
        try:
            row = await conn.fetchrow("SELECT * FROM payauth_dedup_drop_period($1)",
                                      retention_hours)
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError,
                asyncpg.SerializationError) as error:
            busy += 1
            if busy < attempts:
                await asyncio.sleep(1.0)
                continue
            n, oldest = await conn.fetchrow(_STORE_HOLDERS) or (0, None)
            log.warning("purge_period_deferred", attempts=attempts,
                        reason="the detach could not go on", last_error=str(error),
                        holders=n, oldest_seconds=oldest)
            return total
        if row is None:
            return total
        total += row["records"]
        times.files_freed_seconds += await _drop_purged(conn)
        log.info("purge_period_dropped", partition=row["part"], records=row["records"])


async def _drop_charges_of_periods_gone(conn: asyncpg.Connection, attempts: int = 5) -> None:
    """Detach the spending limits' charges of the periods the store no longer holds, in a
    transaction of its own (never with a store's period: a batch locks both tables, in
    either order). One that could not go on (its lock_timeout waited out, or chosen to end
    a deadlock) is tried again a second later, ``attempts`` times in all, then left to the
    next purge."""
    for attempt in range(1, attempts + 1):
        try:
            detached = [r[0] for r in await conn.fetch(
                "SELECT * FROM payauth_limit_charges_drop_periods()")]
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as error:
            if attempt < attempts:
                await asyncio.sleep(1.0)
                continue
            log.warning("purge_charges_deferred", attempts=attempts,
                        reason="the detach could not go on", last_error=str(error))
            return
        if detached:
            log.info("purge_charges_detached", partitions=detached)
        return


async def _drop_purged(conn: asyncpg.Connection) -> float:
    """Drop what the purge detached (also what a purge stopped before dropping), the
    charges' summed first into purged_limit_charges; return the seconds it took."""
    started = time.perf_counter()
    for row in await conn.fetch("SELECT * FROM payauth_dedup_drop_purged()"):
        log.info("purge_files_freed", table=row[0])
    return time.perf_counter() - started


async def purge_once(dsn: str, *, retention_hours: float, batch_size: int = 5_000,
                     pause_seconds: float = 0.0, connect_timeout: float = 60) -> int:
    """``purge`` on a connection of its own, closed afterwards."""
    conn = await asyncpg.connect(dsn, timeout=connect_timeout)
    try:
        return await purge(conn, retention_hours=retention_hours, batch_size=batch_size,
                           pause_seconds=pause_seconds)
    finally:
        await conn.close()
