"""Fault injection for the tests and the chaos run, as wrapper adapters that only the dev
entry point (``service/devtools/entry.py``) installs; production code has no fault hooks.

``PAYAUTH_TEST_FAULT_POINT`` names where the worker dies with SIGKILL, once:

- ``before_db_commit`` / ``after_db_commit``: around the store's authorize call;
- ``after_publish``: once Kafka acknowledged a batch's events, before its offsets are stored;
- ``after_redis_set``: once the fast path was written;
- ``inside_db_transaction``: the authorize call runs in an explicit transaction and the
  worker dies after its writes (claims, holds, dedup records), before its COMMIT;
- ``rollback_once``: not a kill: the first authorize call is rolled back after its writes,
  as a failing COMMIT would (the batch is retried);
- ``connection_lost_after_commit``: not a kill: the first authorize call commits, then its
  connection is closed before the reply is read, as a network cut or a failover would
  leave it (the outcome is unknown to the worker; the retry must find it out).

``PAYAUTH_TEST_UNSAFE_ORDERING=redis_before_commit`` is the deliberately WRONG commit order,
for the checker's negative control: the fast path is written before the database COMMIT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import asyncpg

from service.adapters.postgres import PostgresStore
from service.core.ports import Cache, Publisher, Record, Sighting, Store, TransientError
from service.domain.dedup import StoredResult
from service.domain.messages import Authorization

POINTS = ("before_db_commit", "after_db_commit", "after_publish", "after_redis_set",
          "rollback_once", "connection_lost_after_commit", "inside_db_transaction")


def kill_at(point: str, armed: str) -> None:
    """SIGKILL this process when ``point`` is the armed one."""
    if armed and point == armed:
        sys.stderr.write(f'{{"event": "fault_injected", "point": "{point}"}}\n')
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


class PlannedRollback(TransientError):
    """The transaction was rolled back on purpose after its writes."""


class RollbackOnceStore(PostgresStore):
    """The first authorize call runs in a transaction that is rolled back after its writes."""

    _rolled_back = False  # per instance once set

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        if self._rolled_back:
            return await super()._call_authorize(statement, args)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.fetch(statement, *args)
            self._rolled_back = True
            raise PlannedRollback("rolled back on purpose after the writes")


class LostReplyOnceStore(PostgresStore):
    """The first authorize call commits (autocommit), then its connection is closed under
    it before the worker uses the reply: asyncpg raises what it raises for a connection
    gone in the middle of an operation."""

    _lost = False  # per instance once set

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        if self._lost:
            return await super()._call_authorize(statement, args)
        async with self._pool.acquire() as conn:
            await conn.fetch(statement, *args)
            self._lost = True
            sys.stderr.write('{"event": "fault_injected", "point": '
                             '"connection_lost_after_commit"}\n')
            conn.terminate()
            raise asyncpg.ConnectionDoesNotExistError(
                "connection was closed in the middle of operation")


class KilledInTransactionStore(PostgresStore):
    """The authorize call's writes done inside an open transaction, then SIGKILL: the
    server sees the connection go and rolls them back."""

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(statement, *args)
            kill_at("inside_db_transaction", "inside_db_transaction")
            return rows


class FaultyStore:
    """Kills around the authorize call; or writes the fast path before it (the wrong order)."""

    def __init__(self, inner: Store, cache: Cache, point: str, unsafe_ordering: str) -> None:
        self._inner = inner
        self._cache = cache
        self._point = point
        self._unsafe = unsafe_ordering == "redis_before_commit"

    async def ping(self) -> bool:
        return await self._inner.ping()

    async def load_stored(self, txn_ids: Sequence[str]) -> dict[str, StoredResult]:
        return await self._inner.load_stored(txn_ids)

    async def authorize(self, new: Sequence[Authorization], **source: Any) -> list[StoredResult]:
        if self._unsafe:
            # The planted fault must happen for the negative control to mean anything: a
            # Redis slow to answer (a loaded machine) would otherwise skip the write.
            entries = {a.transaction_id: a.fingerprint for a in new}
            for _ in range(100):
                if await self._cache.set_many(entries):
                    break
                await asyncio.sleep(0.1)
        kill_at("before_db_commit", self._point)
        records = await self._inner.authorize(new, **source)
        kill_at("after_db_commit", self._point)
        return records

    async def mark_published(self, batch_ids: Sequence[Any], txn_ids: Sequence[str]) -> None:
        await self._inner.mark_published(batch_ids, txn_ids)

    async def record_sightings(self, sightings: Sequence[Sighting]) -> None:
        await self._inner.record_sightings(sightings)

    async def replay_marks(self, group_id: str, topic: str) -> dict[int, int]:
        return await self._inner.replay_marks(group_id, topic)


class FaultyPublisher:
    def __init__(self, inner: Publisher, point: str) -> None:
        self._inner = inner
        self._point = point

    async def publish(self, records: Sequence[Record]) -> None:
        await self._inner.publish(records)
        kill_at("after_publish", self._point)


class FaultyCache:
    def __init__(self, inner: Cache, point: str) -> None:
        self._inner = inner
        self._point = point

    @property
    def up(self) -> bool:
        return self._inner.up

    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]:
        return await self._inner.get_many(txn_ids)

    async def set_many(self, fingerprints: dict[str, str]) -> bool:
        done = await self._inner.set_many(fingerprints)
        kill_at("after_redis_set", self._point)
        return done
