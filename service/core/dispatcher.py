"""Batches across partitions, order within each, on the event loop.

Messages wait in a queue per partition. A batch takes what is waiting on partitions that
have no batch in flight (up to ``max_batch``, or its share: below), so one database
transaction, one Redis round trip and one wait for Kafka acknowledgements serve many
partitions at once; a partition is in at most one batch at a time, so its messages are
processed in offset order. Up to ``max_in_flight`` batches run concurrently (on disjoint
partitions), overlapping one batch's waits with another's work. The processor runs the
commit order (``service/core/pipeline.py``), reporting offsets included; here, only scheduling.

Under light load a batch is whatever arrived since the last one (low latency); under heavy
load batches grow by themselves (high throughput). A batch starts while another is in
flight only once ``overlap_from`` messages wait for it, or once the batch in flight has run
for ``overlap_after`` seconds (one retrying, or slow to be acknowledged, never holds the
other partitions back for long): overlapping batches of a few messages each cost more CPU
per message (every batch pays its round trips and its Kafka requests) than they save in
waiting (docs/benchmark.md, "Design figures": overlapping).

Under a steady load every partition has a few messages waiting, so one batch would take
them all and the next could start only when it ended: one batch at a time, PostgreSQL and
Kafka each busy for a part of it, the machine's other core idle. So from twice
``overlap_from`` messages waiting, they are shared by partition among the batches that may
start (``max_in_flight``), in shares of at least ``overlap_from``, and those run at once
(docs/benchmark.md, "Design figures": sharing). A backlog's batches stay full: its shares
are larger than ``max_batch``. What is left below ``overlap_from`` waits for a batch to
end, or for the ``overlap_after`` recheck.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from service.core.ports import TP

log = structlog.get_logger(__name__)


class Processor(Protocol):
    async def process(self, msgs: Sequence[Any]) -> None: ...


class Dispatcher:
    def __init__(
        self,
        processor: Processor,
        *,
        finished_up_to: Callable[[TP], int | None] = lambda _tp: None,
        max_batch: int,
        close_timeout: float,
        max_in_flight: int = 2,
        overlap_from: int = 1,
        overlap_after: float = 0.05,
    ) -> None:
        self._processor = processor
        # Where the processor reported a partition finished (it reports as it goes, e.g.
        # each half of a batch it isolates): a cancelled batch gives back only what is past.
        self._finished_up_to = finished_up_to
        self._max_batch = max_batch
        self._close_timeout = close_timeout
        self._max_in_flight = max_in_flight
        self._overlap_from = overlap_from
        self._overlap_after = overlap_after
        self._started: dict[asyncio.Task[None], float] = {}  # batch → when it started
        self._recheck: asyncio.TimerHandle | None = None
        self._pending: dict[TP, deque[Any]] = {}
        self._busy: set[TP] = set()  # partitions with a batch in flight
        # Each batch in flight: its partitions and its messages (to put back if cancelled).
        self._batches: dict[asyncio.Task[None], tuple[list[TP], list[Any]]] = {}
        self._closed = False
        self._failure: BaseException | None = None
        self._rotation = 0  # which partition goes first, so no partition starves
        # Per partition, each hand-off not yet finished: (its last offset, when it came).
        # The first one's age is the age of the partition's oldest unfinished message.
        self._arrivals: dict[TP, deque[tuple[int, float]]] = {}

    # ------------------------------------------------------------ consumer side
    def submit(self, arrived: Mapping[TP, list[Any]]) -> None:
        """Called on the loop (via call_soon_threadsafe) with one fetch's new messages, per
        partition. A whole fetch at once: handed over a partition at a time, a batch would
        start with the first partition's few messages while the rest of the fetch waited
        for it to finish."""
        if self._closed:
            return
        now = time.monotonic()
        for tp, msgs in arrived.items():
            self._pending.setdefault(tp, deque()).extend(msgs)
            self._arrivals.setdefault(tp, deque()).append((msgs[-1].offset(), now))
        self._start_batches()

    async def revoke(self, tps: list[TP], *, lost: bool) -> None:
        """Forget what waits on these partitions; let batches touching them finish (bounded:
        a batch still retrying is cancelled, and the next owner replays its messages on these
        partitions past what the batch reported finished, safely: nothing past that was
        reported, so no offset past it can be stored)."""
        revoked = set(tps)
        for tp in tps:
            self._pending.pop(tp, None)
            self._arrivals.pop(tp, None)
        touching = {t: b for t, b in self._batches.items() if set(b[0]) & revoked}
        if not touching:
            return
        timeout = 1.0 if lost else self._close_timeout
        _, stuck = await asyncio.wait([asyncio.shield(t) for t in touching], timeout=timeout)
        if not stuck:
            return
        log.warning("revoke_cancelling_batches", partitions=sorted(p for _, p in tps))
        for task in touching:
            task.cancel()
        for task in touching:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # A cancelled batch may also hold partitions we keep: their messages go back to the
        # front of their queues, in order, or the next batch would store an offset past them.
        for task, (parts, batch) in touching.items():
            if task not in self._batches:
                continue  # it finished on its own after all
            kept: dict[TP, list[Any]] = {}
            for msg in batch:
                tp = (msg.topic(), msg.partition())
                finished = self._finished_up_to(tp)
                if tp not in revoked and (finished is None or msg.offset() >= finished):
                    kept.setdefault(tp, []).append(msg)
            for tp, msgs in kept.items():
                self._pending.setdefault(tp, deque()).extendleft(reversed(msgs))
            self._busy.difference_update(parts)
            del self._batches[task]
        if not self._closed:
            self._start_batches()

    async def drain(self) -> None:
        """Shutdown: accept nothing more, finish the batches in flight."""
        self._closed = True
        self._pending.clear()
        await self.revoke(list(self._busy), lost=False)

    def failed(self) -> BaseException | None:
        return self._failure

    def oldest_unfinished(self) -> dict[TP, float]:
        """Seconds since the oldest message not yet finished arrived, per partition that has
        one: grows without bound on a partition that cannot make progress."""
        now = time.monotonic()
        return {tp: now - q[0][1] for tp, q in self._arrivals.items() if q}

    # -------------------------------------------------------------- batching
    def _start_batches(self) -> None:
        while len(self._batches) < self._max_in_flight:
            if self._batches and self._waiting() < self._overlap_from:
                youngest = max(self._started.get(t, 0.0) for t in self._batches)
                wait = youngest + self._overlap_after - time.monotonic()
                if wait > 0:
                    # The batch in flight finishes first, and the next one is larger; unless
                    # it is still running then.
                    if self._waiting() and self._recheck is None:
                        self._recheck = asyncio.get_running_loop().call_later(
                            wait, self._recheck_now)
                    return
            batch, parts = self._take()
            if not batch:
                return
            task = asyncio.create_task(self._run(batch, parts), name="batch")
            self._batches[task] = (parts, batch)
            self._started[task] = time.monotonic()

    def _recheck_now(self) -> None:
        self._recheck = None
        if not self._closed:
            self._start_batches()

    def _waiting(self) -> int:
        """Messages a new batch could take now (on partitions with no batch in flight)."""
        return sum(len(q) for tp, q in self._pending.items() if tp not in self._busy)

    def _take(self) -> tuple[list[Any], list[TP]]:
        ready = [tp for tp, q in self._pending.items() if q and tp not in self._busy]
        if not ready:
            return [], []
        self._rotation = (self._rotation + 1) % len(ready)
        ready = ready[self._rotation:] + ready[:self._rotation]
        # Enough waiting for more than one batch (see the module's docstring): this one
        # takes its share, whole partitions, and leaves the rest to the ones that may start.
        target = self._max_batch
        free = self._max_in_flight - len(self._batches)
        waiting = self._waiting()
        if free > 1 and waiting >= 2 * self._overlap_from:
            target = min(target, max(self._overlap_from, -(-waiting // free)))
        batch: list[Any] = []
        parts: list[TP] = []
        for tp in ready:
            queue = self._pending[tp]
            if len(batch) >= target:
                break
            room = self._max_batch - len(batch)
            take = min(room, len(queue))
            batch.extend(queue.popleft() for _ in range(take))
            parts.append(tp)
            self._busy.add(tp)
        return batch, parts

    async def _run(self, batch: list[Any], parts: list[TP]) -> None:
        task = asyncio.current_task()
        assert task is not None  # always run as a task (see _start_batches)
        try:
            await self._processor.process(batch)
            last: dict[TP, int] = {}
            for msg in batch:
                last[(msg.topic(), msg.partition())] = msg.offset()
            for tp, last_offset in last.items():
                arrivals = self._arrivals.get(tp)
                while arrivals and arrivals[0][0] <= last_offset:
                    arrivals.popleft()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # past the processor's own isolation: the worker stops on it
            self._failure = exc
            # Nothing more may start: a later batch on these partitions would store an
            # offset past the failed messages. Their offsets stay where they are; the next
            # owner replays them.
            self._closed = True
            self._pending.clear()
            log.error("batch_failed", error=repr(exc), partitions=[p for _, p in parts])
        finally:
            # A batch cancelled by revoke() is cleaned up there, after its messages on the
            # partitions we keep are back in their queues (no batch may take them before).
            self._started.pop(task, None)
            if not task.cancelling():
                self._busy.difference_update(parts)
                self._batches.pop(task, None)
                if not self._closed:
                    self._start_batches()
