"""Step 6 of the commit order (``pipeline``), off the critical path: the publication of
acknowledged batches recorded in the store, then their transactions written to the fast
path, many batches at a time. Both are optimizations that may be lost (a crash, the cache
down): the cost is a harmless republication of the same event_id, never a loss."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from uuid import UUID

import structlog

from service import metrics
from service.core.ports import Cache, DataRejected, Sighting, Store, TransientError
from service.domain.dedup import StoredResult

log = structlog.get_logger(__name__)


class Confirmations:
    """Records publication in the store (a receipt per batch that decided transactions, or
    published_at for a republished record), then remembers the transactions in the fast path,
    many batches at a time (one statement and one cache round trip per flush)."""

    def __init__(self, store: Store, cache: Cache) -> None:
        self._store = store
        self._cache = cache
        self._receipts: set[UUID] = set()
        self._republished: list[str] = []
        self._fingerprints: dict[str, str] = {}
        self._sightings: list[Sighting] = []
        self._wakeup = asyncio.Event()

    def add(self, published: Iterable[tuple[StoredResult, bool]],
            fingerprints: dict[str, str], sightings: Sequence[Sighting] = ()) -> None:
        """``published``: each event acknowledged, with whether it was a republication;
        ``fingerprints``: the fast-path values; ``sightings``: the batch's duplicates."""
        for record, repeat in published:
            if record.batch_id is not None and not repeat:
                self._receipts.add(record.batch_id)
            else:
                self._republished.append(record.transaction_id)
        self._fingerprints.update(fingerprints)
        self._sightings.extend(sightings)
        if self._receipts or self._republished or self._fingerprints or self._sightings:
            self._wakeup.set()

    async def flush(self) -> None:
        receipts, self._receipts = self._receipts, set()
        republished, self._republished = self._republished, []
        fingerprints, self._fingerprints = self._fingerprints, {}
        sightings, self._sightings = self._sightings, []
        if receipts or republished:
            try:
                await self._store.mark_published(sorted(receipts), republished)
            except (TransientError, DataRejected) as exc:
                # Harmless: a later duplicate republishes the same event_id once more.
                log.warning("mark_published_failed", error=str(exc)[:300])
        if sightings:
            try:
                await self._store.record_sightings(sightings)
            except (TransientError, DataRejected) as exc:
                # Only `payauth explain`'s per-transaction counts miss them; metrics have them.
                log.warning("record_sightings_failed", error=str(exc)[:300])
        if fingerprints:
            await self._cache.set_many(fingerprints)
            metrics.redis_up.set(1 if self._cache.up else 0)

    async def run(self, interval: float = 0.05) -> None:
        """Flush whenever there is something, at most every ``interval`` seconds."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.flush()
            await asyncio.sleep(interval)
