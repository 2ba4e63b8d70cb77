"""The authorization store on PostgreSQL (asyncpg).

One batch of new authorizations is one transaction, four round trips (plus, once its events
are acknowledged, a receipt for the batch in ``published_batches``, many batches at a time):

    BEGIN
    SELECT … FROM accounts WHERE account_id = ANY(…) ORDER BY account_id FOR UPDATE
        -- lock the accounts (sorted, so two batches lock in the same order), read balances;
        -- the domain decides each authorization in offset order against them
    WITH claimed AS (INSERT INTO processed_transactions … ON CONFLICT (txn_id) DO NOTHING
                     RETURNING txn_id),
         ledger  AS (INSERT INTO ledger_entries …),
         moved   AS (UPDATE accounts SET balance = balance + delta …)
    SELECT count(*) FROM claimed
    COMMIT

The claim is the unique index on ``processed_transactions.txn_id``, not a row lock: an
INSERT of a key that another open transaction inserted waits for it, then conflicts (a
``SELECT … FOR UPDATE`` of a missing row would lock nothing). When fewer rows are claimed
than sent, another replica decided some of them first: we roll back and raise
``ClaimLost``; the caller re-reads the dedup records and sees duplicates.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg

from service.domain.decision import (
    Account,
    DeclineReason,
    Result,
    StoredResult,
    decide_in_order,
)
from service.domain.errors import StoreUnavailable, TransientError
from service.domain.messages import Authorization, fingerprint_of
from service.domain.money import format_amount
from service.faults import FaultInjector


class ClaimLost(TransientError):
    """Another replica claimed a transaction of this batch first; retry the batch."""


class DataRejected(Exception):
    """PostgreSQL refused the data itself (a constraint the validation did not foresee).

    Not transient: retrying the same batch fails the same way. The caller isolates the
    message(s) responsible and dead-letters them."""


# Errors that may pass on retry, by class (never by message text).
_RETRYABLE = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,  # statement_timeout
)
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InsufficientResourcesError,
    asyncpg.ReadOnlySQLTransactionError,
    # A connection left in an impossible state by a server going away mid-operation
    # (seen during PostgreSQL restarts): a fresh connection is the cure, not a stop.
    asyncpg.InternalClientError,
)

# Dedup records are purged after the retention window; the ledger is not. A key found only
# in the ledger (from_ledger) was approved long ago: it is still a duplicate. One round trip.
_LOAD_STORED = """
SELECT p.txn_id, p.fingerprint, p.result, p.decline_reason, p.account_id,
       p.amount::text AS amount_text, p.currency, p.authorization_type, p.correlation_id,
       p.processed_at,
       p.published_at IS NOT NULL
           OR EXISTS (SELECT 1 FROM published_batches b WHERE b.batch_id = p.batch_id)
           AS published,
       false AS from_ledger
  FROM processed_transactions p
 WHERE p.txn_id = ANY($1::text[])
UNION ALL
SELECT l.txn_id, NULL, 'APPROVED', NULL, l.account_id, abs(l.amount)::text, l.currency,
       l.type, NULL, l.created_at, true, true
  FROM ledger_entries l
 WHERE l.txn_id = ANY($1::text[])
   AND NOT EXISTS (SELECT 1 FROM processed_transactions p WHERE p.txn_id = l.txn_id)
"""

_LOCK_ACCOUNTS = """
SELECT account_id, balance, currency, status
  FROM accounts
 WHERE account_id = ANY($1::text[])
 ORDER BY account_id
   FOR UPDATE
"""

_WRITE_BATCH = """
WITH input AS (
    SELECT *
      FROM unnest($1::text[], $2::text[], $3::numeric[], $4::text[], $5::text[], $6::text[],
                  $7::text[], $8::text[], $9::text[], $10::text[], $11::numeric[],
                  $12::integer[], $13::bigint[])
        AS t(txn_id, account_id, amount, currency, auth_type, result, decline_reason,
             fingerprint, correlation_id, message_id, delta, source_partition, source_offset)
), claimed AS (
    INSERT INTO processed_transactions
           (txn_id, processed_at, result, decline_reason, fingerprint, account_id, amount,
            currency, authorization_type, correlation_id, message_id, source_topic,
            source_partition, source_offset, batch_id)
    SELECT txn_id, $14, result, decline_reason, fingerprint, account_id, amount, currency,
           auth_type, correlation_id, message_id, $15, source_partition, source_offset, $16
      FROM input
        ON CONFLICT (txn_id) DO NOTHING
    RETURNING txn_id
), ledger AS (
    INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at)
    SELECT txn_id, account_id, delta, currency, auth_type, $14
      FROM input
     WHERE result = 'APPROVED'
        ON CONFLICT (txn_id) DO NOTHING
    RETURNING 1
), moved AS (
    UPDATE accounts a
       SET balance = a.balance + d.delta, updated_at = $14
      FROM (SELECT account_id, sum(delta) AS delta
              FROM input WHERE result = 'APPROVED' GROUP BY account_id) d
     WHERE a.account_id = d.account_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM claimed) AS claimed, (SELECT count(*) FROM ledger) AS ledger
"""

# Receipts for whole batches whose events were acknowledged, and published_at for records
# republished one by one (decided earlier, never confirmed). One round trip.
_MARK_PUBLISHED = """
WITH receipts AS (
    INSERT INTO published_batches (batch_id, published_at)
    SELECT unnest($1::uuid[]), $3
        ON CONFLICT (batch_id) DO NOTHING
    RETURNING 1
), republished AS (
    UPDATE processed_transactions SET published_at = $3
     WHERE txn_id = ANY($2::text[]) AND published_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM receipts) AS receipts,
       (SELECT count(*) FROM republished) AS republished
"""


def translate(exc: BaseException) -> BaseException:
    """Map an asyncpg/socket error to the service's own error (or return it unchanged)."""
    if isinstance(exc, asyncpg.UniqueViolationError):
        # Both claims use ON CONFLICT, so this is another replica's concurrent insert.
        return ClaimLost(f"unique violation on {exc.constraint_name}: another replica won")
    if isinstance(exc, _RETRYABLE):
        return TransientError(f"{type(exc).__name__}: retry")
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError | asyncpg.DataError):
        return DataRejected(f"{type(exc).__name__}: {exc}")
    return exc


class PlannedRollback(TransientError):
    """Test-only: the transaction was rolled back on purpose after its writes."""


class PostgresStore:
    def __init__(self, pool: asyncpg.Pool, faults: FaultInjector | None = None) -> None:
        self._pool = pool
        self._faults = faults or FaultInjector("")

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 8,
        statement_timeout_ms: int = 10_000,
        lock_timeout_ms: int = 5_000,
        faults: FaultInjector | None = None,
    ) -> PostgresStore:
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=10,
                command_timeout=max(1.0, statement_timeout_ms / 1000 * 2),
                init=_prepare_statements,
                server_settings={
                    "application_name": "payauth-worker",
                    "statement_timeout": str(statement_timeout_ms),
                    "lock_timeout": str(lock_timeout_ms),
                    "idle_in_transaction_session_timeout": str(statement_timeout_ms * 3),
                },
            )
        except Exception as exc:
            raise translate(exc) from exc
        return cls(pool, faults)

    async def close(self) -> None:
        await self._pool.close()

    async def ping(self) -> bool:
        try:
            async with self._pool.acquire(timeout=2) as conn:
                await conn.fetchval("SELECT 1")
            return True
        except Exception:
            return False

    async def load_stored(self, txn_ids: Sequence[str]) -> dict[str, StoredResult]:
        """Dedup records (and ledger-only approvals) for these keys; outside any transaction,
        since the claim in ``authorize`` is what decides races."""
        if not txn_ids:
            return {}
        try:
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(_LOAD_STORED, list(txn_ids))
            return {
                row["txn_id"]: _stored_from_ledger(row) if row["from_ledger"]
                else _stored_from_row(row)
                for row in rows
            }
        except Exception as exc:
            raise translate(exc) from exc

    async def authorize(
        self,
        new: Sequence[Authorization],
        *,
        source_topic: str,
        source_partitions: Sequence[int],
        source_offsets: Sequence[int],
    ) -> list[StoredResult]:
        """Decide and commit a batch of transactions not seen before, in offset order.

        Raises ``ClaimLost`` (rolled back) when another replica decided one of them first.
        """
        processed_at = datetime.now(UTC)
        batch_id = uuid.uuid4()  # its receipt, once the events are acknowledged
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(_LOCK_ACCOUNTS, sorted({a.account_id for a in new}))
                accounts = {
                    r["account_id"]: Account(
                        r["account_id"], r["balance"], r["currency"], r["status"]
                    )
                    for r in rows
                }
                decisions = decide_in_order(new, accounts)
                written = await conn.fetchrow(
                    _WRITE_BATCH,
                    [a.transaction_id for a in new],
                    [a.account_id for a in new],
                    [Decimal(a.amount_text) for a in new],
                    [a.currency for a in new],
                    [a.authorization_type.value for a in new],
                    [d.result.value for d in decisions],
                    [d.decline_reason.value if d.decline_reason else None for d in decisions],
                    [a.fingerprint for a in new],
                    [a.correlation_id for a in new],
                    [a.message_id for a in new],
                    [d.delta for d in decisions],
                    list(source_partitions),
                    list(source_offsets),
                    processed_at,
                    source_topic,
                    batch_id,
                )
                assert written is not None  # a SELECT of two counts always returns a row
                approved = sum(d.result is Result.APPROVED for d in decisions)
                if written["claimed"] != len(new) or written["ledger"] != approved:
                    # Leaving the block with an exception rolls the whole batch back.
                    raise ClaimLost(
                        f"claimed {written['claimed']} of {len(new)} (ledger "
                        f"{written['ledger']} of {approved}); another replica decided first"
                    )
                if self._faults.once("rollback_once"):
                    raise PlannedRollback("rolled back on purpose after the writes (test)")
        except (ClaimLost, DataRejected, PlannedRollback):
            raise
        except Exception as exc:
            raise translate(exc) from exc
        return [
            StoredResult(
                transaction_id=a.transaction_id,
                fingerprint=a.fingerprint,
                result=d.result,
                decline_reason=d.decline_reason,
                account_id=a.account_id,
                amount_text=a.amount_text,
                currency=a.currency,
                authorization_type=a.authorization_type.value,
                correlation_id=a.correlation_id,
                processed_at=processed_at,
                published=False,
                batch_id=batch_id,
            )
            for a, d in zip(new, decisions, strict=True)
        ]

    async def mark_published(self, batch_ids: Sequence[uuid.UUID],
                             txn_ids: Sequence[str]) -> None:
        """Record that these batches' events (and these republished ones) were acknowledged."""
        if not batch_ids and not txn_ids:
            return
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(_MARK_PUBLISHED, list(batch_ids), list(txn_ids),
                                   datetime.now(UTC))
        except Exception as exc:
            raise translate(exc) from exc

    async def count_dedup_records(self) -> int:
        try:
            async with self._pool.acquire() as conn:
                return int(await conn.fetchval("SELECT count(*) FROM processed_transactions"))
        except Exception as exc:
            raise translate(exc) from exc


async def _prepare_statements(conn: asyncpg.Connection) -> None:
    """Run each statement of the hot path once, with nothing to do, on every new connection:
    asyncpg then holds it prepared and knows its array types, so the first batches that
    meet this connection do not pay for a prepare and a type introspection (tens of ms)."""
    empty: list[Any] = []
    try:
        await conn.fetch(_LOAD_STORED, empty)
        await conn.fetch(_LOCK_ACCOUNTS, empty)
        await conn.fetchrow(_WRITE_BATCH, *([empty] * 13), datetime.now(UTC), "", uuid.uuid4())
        await conn.execute(_MARK_PUBLISHED, empty, empty, datetime.now(UTC))
    except asyncpg.UndefinedTableError:
        pass  # not migrated yet: the first batch will say so; the connection is still fine


def _stored_from_row(row: Any) -> StoredResult:
    return StoredResult(
        transaction_id=row["txn_id"],
        fingerprint=row["fingerprint"],
        result=Result(row["result"]),
        decline_reason=DeclineReason(row["decline_reason"]) if row["decline_reason"] else None,
        account_id=row["account_id"],
        amount_text=format_amount(Decimal(row["amount_text"]), row["currency"]),
        currency=row["currency"],
        authorization_type=row["authorization_type"],
        correlation_id=row["correlation_id"],
        processed_at=row["processed_at"],
        published=row["published"],
    )


def _stored_from_ledger(row: Any) -> StoredResult:
    # The dedup record is gone but the ledger still says what was approved, which is all the
    # fingerprint covers; the event was published long ago (the record outlived delivery).
    currency = row["currency"]
    amount_text = format_amount(Decimal(row["amount_text"]), currency)
    auth_type = row["authorization_type"]
    return StoredResult(
        transaction_id=row["txn_id"],
        fingerprint=fingerprint_of(row["account_id"], amount_text, currency, auth_type),
        result=Result.APPROVED,
        decline_reason=None,
        account_id=row["account_id"],
        amount_text=amount_text,
        currency=currency,
        authorization_type=auth_type,
        correlation_id=None,
        processed_at=row["processed_at"],
        published=True,
    )
