"""The authorization store on PostgreSQL (asyncpg).

Over 400 lines: the store's statements, the translation of its errors and the methods that
run them are one adapter, each part read against the others.

One batch of new authorizations is one statement, one round trip, committed on its own:
``SELECT … FROM payauth_authorize(arrays, one element per message in offset order)``, each
array sent as one joined text (``pg_columns``). What happens inside, and which route it
takes, is written once, at the top of ``sql/payauth_authorize.sql``: lock the accounts,
choose the route, decide with ``payauth_decide``, claim each ``transaction_id`` under the
unique index of ``processed_transactions``, write the ledger, the holds and the dedup
records (with the inputs each decision read, for ``payauth replay --shadow``), move the
balances.

Once its events are acknowledged, the batch gets a receipt in ``published_batches`` (many
batches per statement). Before it, one more round trip reads the dedup records of the
batch's keys (``load_stored``; the keys as one joined text too), outside any transaction.

The claim is the unique index on ``processed_transactions.txn_id``, not a row lock: an
INSERT of a key that another open transaction inserted waits for it, then conflicts (a
``SELECT … FOR UPDATE`` of a missing row would lock nothing). The statement then answers
the keys another replica decided first as lost, and decides the rest: ``authorize`` leaves
the lost ones out of its answer, and the caller looks them up again (duplicates, or
conflicts); a claim of the period before that won is answered so too. When the statement
cannot name them, it raises SQLSTATE PA409, everything is rolled back, and we raise
``ClaimLost``: the caller retries the batch. A statement cancelled by ``statement_timeout`` raises
``StatementTimedOut``: the caller decides the batch in smaller parts.
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, Self

import asyncpg

from service.adapters.pg_columns import joined, split
from service.adapters.pg_records import (
    decided_result,
    stored_from_ledger,
    stored_from_row,
    with_day,
)
from service.adapters.retention import prepare_periods
from service.core import ports
from service.core.ports import (
    ClaimLost,
    DataRejected,
    Sighting,
    StatementTimedOut,
    StoreUnavailable,
    TransientError,
)
from service.domain.dedup import StoredResult
from service.domain.messages import Authorization
from service.domain.vocabulary import DeclineReason, Result

# Errors that may pass on retry, by class (never by message text).
_RETRYABLE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError,
              asyncpg.LockNotAvailableError)
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

# Refused: this login (class 28: a bad password, no pg_hba line), a grant, or the server's
# certificate (ssl.SSLError is an OSError: checked before _UNAVAILABLE).
_REFUSED = (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InsufficientPrivilegeError,
            ssl.SSLError)

# A write, so that its COMMIT waits for the synchronous standby (load_stored, migration 008).
_CONFIRM_DURABLE = """
UPDATE durability_barrier SET touched_at = now() WHERE slot = pg_backend_pid() % 16
"""

# Dedup records are purged after the retention window; the ledger and the lifecycle records
# are not. A key found only in the ledger (from_ledger) was approved long ago, one found only
# in lifecycle_messages was decided long ago: still a duplicate. One round trip; the second
# part probes the purged ones' two tables per key in one pass.
#
# A record never confirmed published is published again, every event of it the same as the
# first time: its deltas as the decision answered them (sql/payauth_authorize.sql: a
# REVERSAL credited a purchase back when it wrote a ledger entry of its own, else released
# what it applied from a hold; an orphan changed nothing when it came, whatever its
# original's arrival wrote under its id since; a hold placed counts whole) and the orphan
# reversals its arrival applied, in the order they were applied. A purchase's or refund's
# deltas follow from its kind and amount (NULL here: service/domain/events.py). The deltas
# are expressions of the row, not a lateral join: the statement is planned at every batch.
#
# Each key is looked up by its own index probes (a lateral subquery kept apart by OFFSET 0,
# and a NOT EXISTS the planner cannot turn into a join), whatever the planner guesses: a
# period's partition is young and never analyzed for its first minute or so, and with no
# statistics the planner read the whole partition for a batch's keys (100,000 records: 0.8 s
# of CPU a batch, instead of a few ms), as it did the ledger of a new deployment.
_LOAD_STORED = f"""
SELECT p.txn_id, p.fingerprint, p.result, p.decline_reason, p.account_id,
       p.amount::text AS amount_text, p.currency, p.authorization_type, p.correlation_id,
       p.processed_at, p.source_partition, p.message_id,
       p.published_at IS NOT NULL
           OR EXISTS (SELECT 1 FROM published_batches b WHERE b.batch_id = p.batch_id)
           AS published,
       false AS from_ledger, p.original_txn_id, p.amount_applied::text AS applied_text,
       p.forced, p.orphan,
       CASE WHEN p.authorization_type NOT IN ('PURCHASE', 'REFUND', 'VERIFICATION',
                                               'BALANCE_INQUIRY') THEN
           (CASE WHEN p.result <> 'APPROVED' THEN 0
                 WHEN p.authorization_type = 'CLEARING'
                     THEN -coalesce(p.amount_approved, p.amount)
                 WHEN p.authorization_type = 'REVERSAL' AND NOT coalesce(p.orphan, false)
                     THEN coalesce((SELECT l.amount FROM ledger_entries l
                                     WHERE l.txn_id = p.txn_id), 0)
                 ELSE 0 END)::text END AS balance_delta,
       CASE WHEN p.authorization_type NOT IN ('PURCHASE', 'REFUND', 'VERIFICATION',
                                               'BALANCE_INQUIRY') THEN
           (CASE WHEN p.result <> 'APPROVED' THEN 0
                 WHEN p.authorization_type IN ('AUTHORIZATION', 'ADVICE')
                     THEN coalesce(p.amount_approved, p.amount) - coalesce(p.already_cleared, 0)
                 WHEN p.authorization_type = 'INCREMENTAL' THEN coalesce(p.amount_approved, 0)
                 WHEN p.authorization_type = 'CLEARING' THEN -coalesce(p.amount_applied, 0)
                 WHEN p.authorization_type = 'REVERSAL'
                      AND NOT EXISTS (SELECT 1 FROM ledger_entries l WHERE l.txn_id = p.txn_id)
                     THEN -coalesce(p.amount_applied, 0)
                 ELSE 0 END)::text END AS held_delta,
       o.applied_ids, o.applied_amounts, o.applied_correlations,
       p.input_currency::text AS account_currency,
       p.amount_approved::text AS approved_text,
       p.amount_approved < payauth_account_amount(p.input_currency::text, p.currency::text,
                                                  p.amount, p.billing_currency::text,
                                                  p.billing_amount) AS partial,
       p.billing_amount::text AS billing_text, p.billing_currency::text AS billing_currency,
       p.final, p.ledger_balance::text AS ledger_text,
       CASE WHEN p.ledger_balance IS NOT NULL THEN p.input_balance::text END AS available_text,
       p.already_cleared::text AS cleared_text, NULL AS request_fingerprint,
       CASE WHEN p.decline_reason = 'CARD_BLOCKED' THEN p.input_card_status END
           AS card_status,
       p.limit_id
  FROM unnest({split("$1")}) AS q(id)
 CROSS JOIN LATERAL (SELECT * FROM processed_transactions x WHERE x.txn_id = q.id
                     OFFSET 0) p
  LEFT JOIN LATERAL (
       SELECT array_agg(r.txn_id ORDER BY r.arrival) AS applied_ids,
              array_agg(r.applied::text ORDER BY r.arrival) AS applied_amounts,
              array_agg(m.correlation_id ORDER BY r.arrival)
                  AS applied_correlations
         FROM orphan_reversals r LEFT JOIN lifecycle_messages m ON m.txn_id = r.txn_id
        WHERE r.original_txn_id = p.txn_id AND r.state = 'APPLIED') o ON true
UNION ALL
SELECT k.id, k.fingerprint, coalesce(k.result, 'APPROVED'), k.decline_reason,
       coalesce(k.account_id, k.l_account), coalesce(k.amount, abs(k.l_amount))::text,
       coalesce(k.currency, k.l_currency), coalesce(k.kind, k.l_type), k.correlation_id,
       coalesce(k.processed_at, k.l_created), NULL, NULL, true, k.txn_id IS NULL,
       k.original_txn_id, k.amount_applied::text, k.forced, k.orphan, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, k.final, NULL, NULL, NULL, k.l_fingerprint,
       NULL, NULL
  FROM (SELECT k.id, m.txn_id, m.fingerprint, m.result, m.decline_reason, m.account_id,
               m.amount, m.currency, m.kind, m.correlation_id, m.processed_at,
               m.original_txn_id, m.amount_applied, m.forced, m.orphan, m.final,
               l.account_id AS l_account, l.amount AS l_amount,
               l.currency AS l_currency, l.type AS l_type, l.created_at AS l_created,
               l.request_fingerprint AS l_fingerprint, l.txn_id AS l_txn
          FROM unnest({split("$1")}) AS k(id)
          LEFT JOIN LATERAL (SELECT * FROM lifecycle_messages x WHERE x.txn_id = k.id
                             OFFSET 0) m ON true
          LEFT JOIN LATERAL (SELECT * FROM ledger_entries x WHERE x.txn_id = k.id
                                AND x.type IN ('PURCHASE', 'REFUND') OFFSET 0) l ON true
         WHERE m.txn_id IS NOT NULL OR l.txn_id IS NOT NULL
        -- (A fence: only the few keys found here probe every period of the dedup store.)
        OFFSET 0) AS k
 WHERE NOT EXISTS (SELECT 1 FROM processed_transactions p WHERE p.txn_id = k.id OFFSET 0)
"""

# Locks, decides and writes the batch, and commits on its own: one round trip
# (sql/payauth_authorize.sql); the columns go as joined texts (``pg_columns``). A claim lost
# comes first, as a row naming it; SQLSTATE PA409 when one cannot be named. Public: the
# benchmark measures this very statement with pgbench.
AUTHORIZE_STATEMENT = f"""
SELECT *
  FROM payauth_authorize({split("$1")}, {split("$2")}, {split("$3", "::numeric[]")},
                         {split("$4")}, {split("$5")}, {split("$6")}, {split("$7")},
                         {split("$8")}, {split("$9", "::integer[]")},
                         {split("$10", "::bigint[]")}, $11, $12, $13, {split("$14")},
                         {split("$15", "::numeric[]")}, {split("$16")},
                         {split("$17", "::boolean[]")}, {split("$18", "::boolean[]")},
                         {split("$19")}, {split("$20")}, {split("$21")},
                         {split("$22")}, $23)
"""
_CLAIM_LOST_SQLSTATE = "PA409"


def _message_times(batch: Sequence[Authorization], processed_at: datetime) -> list[str]:
    """Each message's own time, whose period its spending limits count in: its
    headers.timestamp (a naive one is UTC), or, for a message that has none, when it is
    decided. Each distinct time is written once a batch: a network stamps its messages to
    the second, so a batch's thousand messages carry a few dozen times (equal instants
    written alike: PostgreSQL reads the same timestamptz from either)."""
    written: dict[datetime | None, str] = {}
    out = []
    for auth in batch:
        sent = auth.sent_at
        text = written.get(sent)
        if text is None:
            moment = processed_at if sent is None else \
                sent if sent.tzinfo is not None else sent.replace(tzinfo=UTC)
            text = written[sent] = moment.isoformat()
        out.append(text)
    return out


_FLAG = {True: "t", False: "f"}  # a boolean column's texts

_RESULTS = {r.value: r for r in Result}  # a dict lookup, not an enum call per row

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

_LIFECYCLE_GAUGES = """
WITH per AS (SELECT currency::text AS currency, count(*) AS n, sum(remaining) AS amount
               FROM holds WHERE state = 'ACTIVE' GROUP BY currency)
SELECT (SELECT coalesce(array_agg(currency), '{}') FROM per) AS currencies,
       (SELECT coalesce(array_agg(n), '{}') FROM per) AS counts,
       (SELECT coalesce(array_agg(amount::float8), '{}') FROM per) AS amounts,
       (SELECT count(*) FROM holds WHERE state = 'ACTIVE'
           AND placed_at <= now() - $1::numeric * interval '1 hour') AS overdue,
       (SELECT count(*) FROM holds WHERE state = 'EXPIRED') AS expired,
       (SELECT count(*) FROM holds WHERE state = 'EXPIRED' AND expiry_published_at IS NULL)
           AS unpublished,
       (SELECT count(*) FROM orphan_reversals WHERE state = 'WAITING') AS orphans,
       (SELECT extract(epoch FROM now() - min(processed_at))::float8
          FROM processed_transactions) AS oldest_dedup_seconds
"""
# The cards not ACTIVE, by status; the ten limits nearest their ceiling in the period under
# way (usage over maximum, by amount or count, whichever is nearer).
# The dedup store's parts: the table itself, or each partition of it (relkind 'r': a
# partitioned parent holds no rows): rows as the statistics estimate them (reltuples, kept
# by autovacuum; -1 before a part's first analyze), bytes with indexes and TOAST.
_DEDUP_STORE_PARTS = """
SELECT c.oid::regclass::text AS part, c.reltuples, pg_total_relation_size(c.oid) AS bytes
  FROM pg_class c
 WHERE c.relkind = 'r'
   AND c.oid IN (SELECT 'processed_transactions'::regclass
                 UNION ALL
                 SELECT t.relid FROM pg_partition_tree('processed_transactions') t)
"""
_CONTROLS_GAUGES = """
WITH frozen AS (
    SELECT status, count(*) AS n FROM cards WHERE status <> 'ACTIVE' GROUP BY status
), nearest AS (
    SELECT l.limit_id,
           greatest(u.amount / nullif(l.max_amount, 0),
                    u.count::numeric / nullif(l.max_count, 0))::float8 AS ratio
      FROM limit_usage u JOIN spending_limits l USING (limit_id)
     WHERE u.period_start >= date_trunc('month', now() AT TIME ZONE $1)::date - 7
       AND u.period_start = payauth_period_start(l.period, now(), $1)
     ORDER BY 2 DESC NULLS LAST
     LIMIT 10
)
SELECT (SELECT coalesce(array_agg(status ORDER BY status), '{}') FROM frozen) AS statuses,
       (SELECT coalesce(array_agg(n ORDER BY status), '{}') FROM frozen) AS counts,
       (SELECT coalesce(array_agg(limit_id ORDER BY ratio DESC NULLS LAST), '{}')
          FROM nearest) AS limit_ids,
       (SELECT coalesce(array_agg(coalesce(ratio, 0) ORDER BY ratio DESC NULLS LAST), '{}')
          FROM nearest) AS ratios
"""
_RECORD_SIGHTINGS = """INSERT INTO duplicate_sightings (seen_at, cause, layer, partition, txn_ids)
VALUES ($1, $2, $3, $4, $5::text[])"""
_REPLAY_MARKS = """SELECT partition, before_offset FROM replay_marks
WHERE group_id = $1 AND topic = $2"""


def translate(exc: BaseException) -> BaseException:
    """Map an asyncpg/socket error to the service's own error (the ports' and the domain's);
    anything else (a bug) is returned unchanged."""
    if getattr(exc, "sqlstate", None) == _CLAIM_LOST_SQLSTATE:
        return ClaimLost(str(exc))
    if isinstance(exc, asyncpg.QueryCanceledError):  # statement_timeout
        return StatementTimedOut(f"{type(exc).__name__}: {str(exc)[:200]}")
    if isinstance(exc, asyncpg.UniqueViolationError):
        # payauth_authorize answers a claim's key violated itself (a row naming it, or PA409
        # above); a key violated elsewhere is retried as a lost claim too, the batch looked
        # up again first.
        return ClaimLost(f"unique violation on {exc.constraint_name}: another replica won")
    if isinstance(exc, _RETRYABLE):
        return TransientError(f"{type(exc).__name__}: retry")
    if isinstance(exc, _REFUSED):
        return ports.StoreRefused(f"PostgreSQL refused: {type(exc).__name__}: {str(exc)[:200]}")
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError | asyncpg.DataError):
        return DataRejected(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, asyncpg.PostgresError):
        # Any other refusal (a missing function or grant after a bad deploy, an internal
        # error) is about the database, not about a message: the partitions wait, /readyz
        # says PostgreSQL is not answering, and no message is dead-lettered for it.
        return StoreUnavailable(f"PostgreSQL refused the work: {type(exc).__name__} "
                                f"(SQLSTATE {exc.sqlstate}): {str(exc)[:200]}")
    return exc


def _raise_translated(exc: BaseException) -> NoReturn:
    translated = translate(exc)
    if translated is exc:
        raise exc
    raise translated from exc


class PostgresStore:
    """Implements ``ports.Store``."""

    def __init__(self, pool: asyncpg.Pool, limits_timezone: str = "UTC") -> None:
        self._pool = pool
        self._limits_timezone = limits_timezone

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 2,
        max_size: int = 8,
        statement_timeout_ms: int = 10_000,
        lock_timeout_ms: int = 5_000,
        limits_timezone: str = "UTC",
    ) -> Self:
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=10,
                command_timeout=max(1.0, statement_timeout_ms / 1000 * 2),
                init=_prepare_statements,
                reset=_keep_session,
                server_settings={
                    "application_name": "payauth-worker",
                    "statement_timeout": str(statement_timeout_ms),
                    "lock_timeout": str(lock_timeout_ms),
                    "idle_in_transaction_session_timeout": str(statement_timeout_ms * 3),
                    # Plan each execution for its own array of keys. A cached generic plan is
                    # chosen once, from the statistics of the moment: made while the tables
                    # were young, it kept scanning them as they grew (a key lookup slowed by
                    # orders of magnitude within tens of thousands of rows). Planning
                    # costs little, a few times per batch, as long as no statement compares
                    # a column whose values repeat with a batch's array (= ANY: each element
                    # is estimated against the column's most common values;
                    # sql/payauth_batch_controls.sql joins the array instead).
                    "plan_cache_mode": "force_custom_plan",
                    # No JIT compilation: a batch's statements run for milliseconds, and a
                    # plan costed high on tables without statistics yet (a period's young
                    # partition) was compiled for hundreds of ms each time, every batch.
                    "jit": "off",
                },
            )
        except Exception as exc:
            _raise_translated(exc)
        return cls(pool, limits_timezone)

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
        since the claim in ``authorize`` is what decides races.

        Only decisions on the synchronous standby come back. One can be visible on the
        primary alone: its client cancelled the wait for replication (the commit stays, with
        a WARNING), or the primary recovered it after a crash; published so, a failover
        would lose a decision the world has seen. So when a record was never confirmed
        published, a small write on the same connection (migration 008) commits first: its
        COMMIT waits until the standby has the WAL up to it, every commit before it too. A
        confirmed record needs none: it was published after a COMMIT that waited, or after
        this write."""
        if not txn_ids:
            return {}
        try:
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(_LOAD_STORED, joined(txn_ids))
                if not all(row["published"] for row in rows):
                    done = await conn.execute(_CONFIRM_DURABLE)
                    if done != "UPDATE 1":  # no row, no WAL written, nothing waited for
                        raise StoreUnavailable(f"durability_barrier answered {done!r}")
            return {
                row["txn_id"]: stored_from_ledger(row) if row["from_ledger"]
                else stored_from_row(row)
                for row in rows
            }
        except StoreUnavailable:
            raise
        except Exception as exc:
            _raise_translated(exc)

    async def authorize(
        self,
        new: Sequence[Authorization],
        *,
        source_topic: str,
        source_partitions: Sequence[int],
        source_offsets: Sequence[int],
    ) -> list[StoredResult]:
        """Decide and commit a batch of transactions not seen before, in offset order: the
        records of those decided. One that another replica decided first, while the batch
        waited for it, has none (nothing of it written here): the caller looks it up.

        Raises ``ClaimLost`` (all of this call rolled back) when a claim was lost that the
        statement could not name.
        """
        processed_at = datetime.now(UTC)
        batch_id = uuid.uuid4()  # its receipt, once the events are acknowledged
        args: tuple[Any, ...] = (
            joined([a.transaction_id for a in new]),
            joined([a.account_id for a in new]),
            joined([a.amount_text for a in new]),
            joined([a.currency for a in new]),
            joined([a.authorization_type for a in new]),
            joined([a.fingerprint for a in new]),
            joined([a.correlation_id for a in new]),
            joined([a.message_id for a in new]),
            joined([str(p) for p in source_partitions]),
            joined([str(o) for o in source_offsets]),
            processed_at,
            source_topic,
            batch_id,
        )
        try:
            rows = await self._call_authorize(AUTHORIZE_STATEMENT, (
                *args, joined([a.original_transaction_id for a in new]),
                joined([a.billing_amount_text for a in new]),
                joined([a.billing_currency for a in new]),
                joined([_FLAG[a.partial_ok] for a in new]),
                joined([_FLAG[a.final] for a in new]),
                joined([a.card_id for a in new]),
                joined([a.merchant_category for a in new]),
                joined([a.merchant_country for a in new]),
                joined(_message_times(new, processed_at)),
                self._limits_timezone))
        except Exception as exc:
            _raise_translated(exc)
        if rows and rows[0]["claim_lost"] is not None:  # (the lost come first)
            lost = {row["claim_lost"] for row in rows if row["claim_lost"] is not None}
            rows = [row for row in rows if row["claim_lost"] is None]
            decided = [(a, p) for a, p in zip(new, source_partitions, strict=True)
                       if a.transaction_id not in lost]
            new = [a for a, _ in decided]
            source_partitions = [p for _, p in decided]
        # The purchases route answers no deltas; every other route answers them for every
        # message but a mismatch: its first row says which route the batch took.
        if rows and rows[0]["balance_delta"] is None and rows[0]["mismatch"] is None:
            return self._purchases(new, rows, processed_at, batch_id, source_partitions)
        return [decided_result(a, row, processed_at, batch_id, partition)
                for a, row, partition in zip(new, rows, source_partitions, strict=True)]

    @staticmethod
    def _purchases(new: Sequence[Authorization], rows: Sequence[asyncpg.Record],
                   processed_at: datetime, batch_id: uuid.UUID,
                   source_partitions: Sequence[int]) -> list[StoredResult]:
        """The purchases route's answer (a result and a reason a message; the deltas follow
        from each one's kind and what was approved): the fewest steps per message, and the
        rest (a partial approval, a conversion, an inquiry's figures) only where a row has
        it."""
        decisions = [
            (_RESULTS[r["result"]],
             DeclineReason(r["decline_reason"]) if r["decline_reason"] else None)
            for r in rows
        ]
        records = [
            StoredResult(
                transaction_id=a.transaction_id,
                fingerprint=a.fingerprint,
                result=result,
                decline_reason=reason,
                account_id=a.account_id,
                amount_text=a.amount_text,
                currency=a.currency,
                authorization_type=a.authorization_type,
                correlation_id=a.correlation_id,
                processed_at=processed_at,
                published=False,
                batch_id=batch_id,
                source_partition=partition,
                message_id=a.message_id,
            )
            for a, (result, reason), partition in zip(new, decisions, source_partitions,
                                                      strict=True)]
        for a, record, row in zip(new, records, rows, strict=True):
            if row["account_currency"] != a.currency or row["approved"] is not None \
                    or row["ledger_balance"] is not None or a.billing_currency is not None \
                    or row["card_status"] is not None or row["limit_id"] is not None:
                with_day(record, a, row)
        return records

    async def record_sightings(self, sightings: Sequence[Sighting]) -> None:
        """One row per batch's (cause, layer, partition): never a row per duplicate."""
        if not sightings:
            return
        try:
            async with self._pool.acquire() as conn:
                await conn.executemany(_RECORD_SIGHTINGS, [
                    (datetime.now(UTC), cause.value, layer.value, partition, ids)
                    for cause, layer, partition, ids in sightings])
        except Exception as exc:
            _raise_translated(exc)

    async def replay_marks(self, group_id: str, topic: str) -> dict[int, int]:
        try:
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(_REPLAY_MARKS, group_id, topic)
        except Exception as exc:
            _raise_translated(exc)
        return {row["partition"]: row["before_offset"] for row in rows}

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        """The one round trip (``AUTHORIZE_STATEMENT``); the call commits on its own. (A seam
        for the test-only stores that roll a call back after its writes, as a failing COMMIT
        would, or lose its reply after the COMMIT, as a broken connection would.)"""
        async with self._pool.acquire() as conn:
            return await conn.fetch(statement, *args)

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
            _raise_translated(exc)

    async def lifecycle_gauges(self, expiry_hours: float) -> dict[str, Any]:
        """What the lifecycle's gauges show (``metrics``): one read-only round trip."""
        try:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(_LIFECYCLE_GAUGES, str(expiry_hours))
        except Exception as exc:
            _raise_translated(exc)
        return dict(row) if row else {}

    async def controls_gauges(self, limits_timezone: str) -> dict[str, Any]:
        """What the card controls' gauges show (``metrics``): one read-only round trip."""
        try:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(_CONTROLS_GAUGES, limits_timezone)
        except Exception as exc:
            _raise_translated(exc)
        return dict(row) if row else {}

    async def prepare_dedup_periods(self) -> tuple[list[str], int]:
        """Make the dedup store's partitions of the period under way and the ones ahead
        where missing; the ones made, and the length of a period in seconds."""
        try:
            async with self._pool.acquire() as conn:
                made = await prepare_periods(conn)
                seconds = await conn.fetchval("SELECT period_seconds FROM dedup_store")
        except Exception as exc:
            _raise_translated(exc)
        return made, int(seconds)

    async def dedup_store_size(self) -> tuple[int, int]:
        """The dedup store's rows (PostgreSQL's estimate) and bytes on disk."""
        try:
            async with self._pool.acquire() as conn:
                parts = await conn.fetch(_DEDUP_STORE_PARTS)
                records = 0
                for part in parts:
                    # (A part never analyzed is young: counted, the only exact count.)
                    records += int(part["reltuples"]) if part["reltuples"] >= 0 else int(
                        await conn.fetchval(f"SELECT count(*) FROM {part['part']}"))
        except Exception as exc:
            _raise_translated(exc)
        return records, sum(int(part["bytes"]) for part in parts)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A connection taken back by the pool: asyncpg rolls back a transaction left open; the
    rest of its default reset (a round trip per release, on each batch's path) undoes what
    this pool never does: advisory locks (purge and migrate use connections of their own),
    cursors, LISTEN, SET."""


async def _prepare_statements(conn: asyncpg.Connection) -> None:
    """Run each statement of the hot path once, with nothing to do, on every new connection:
    asyncpg then holds it prepared and knows its parameter types, so the first batches that
    meet this connection do not pay for a prepare and a type introspection (tens of ms)."""
    empty: list[Any] = []
    try:
        await conn.fetch(_LOAD_STORED, "")
        await conn.fetch(AUTHORIZE_STATEMENT, *([""] * 10), datetime.now(UTC), "", uuid.uuid4(),
                         *([""] * 9), "UTC")
        await conn.execute(_MARK_PUBLISHED, empty, empty, datetime.now(UTC))
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedFunctionError):
        pass  # not migrated yet: the first batch will say so; the connection is still fine
