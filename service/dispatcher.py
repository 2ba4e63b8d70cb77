"""Per-partition ordering with concurrency across partitions, on the event loop.

Each assigned partition has a queue and one task that processes its messages in offset
order, a micro-batch at a time (whatever queued up while the previous batch ran, up to
``max_batch``). Different partitions run concurrently. When a batch finishes, its offsets
are reported to the ``OffsetTracker`` for the consumer thread to store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import structlog

from service.adapters.kafka import TP, OffsetTracker

log = structlog.get_logger(__name__)


class Processor(Protocol):
    async def process(self, msgs: Sequence[Any]) -> None: ...


class _Partition:
    def __init__(self, tp: TP, processor: Processor, tracker: OffsetTracker, max_batch: int):
        self.tp = tp
        self._processor = processor
        self._tracker = tracker
        self._max_batch = max_batch
        self.pending: deque[Any] = deque()
        self._wakeup = asyncio.Event()
        self.closing = False
        self.task = asyncio.create_task(self._run(), name=f"partition-{tp[1]}")

    def add(self, msgs: list[Any]) -> None:
        if self.closing:
            return  # revoked: the next owner reads these again from the committed offset
        self.pending.extend(msgs)
        self._wakeup.set()

    async def _run(self) -> None:
        while not self.closing:
            if not self.pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            count = min(len(self.pending), self._max_batch)
            batch = [self.pending.popleft() for _ in range(count)]
            await self._processor.process(batch)
            self._tracker.done(self.tp, batch[-1].offset() + 1, len(batch))

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - bounds a shield
        """Stop after the batch in progress (bounded by ``timeout``); drop the rest."""
        self.closing = True
        self.pending.clear()
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            log.warning("partition_close_timeout", partition=self.tp[1])
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class Dispatcher:
    def __init__(
        self,
        processor: Processor,
        tracker: OffsetTracker,
        *,
        max_batch: int,
        close_timeout: float,
    ) -> None:
        self._processor = processor
        self._tracker = tracker
        self._max_batch = max_batch
        self._close_timeout = close_timeout
        self._partitions: dict[TP, _Partition] = {}
        self._closed = False

    def submit(self, tp: TP, msgs: list[Any]) -> None:
        if self._closed:
            return
        part = self._partitions.get(tp)
        if part is None or part.closing:
            part = self._partitions[tp] = _Partition(
                tp, self._processor, self._tracker, self._max_batch
            )
        part.add(msgs)

    async def revoke(self, tps: list[TP], *, lost: bool) -> None:
        parts = [p for tp in tps if (p := self._partitions.pop(tp, None)) is not None]
        # Lost partitions belong to someone else already: do not wait for our work on them
        # to finish longer than necessary, but still let a running transaction complete.
        timeout = 1.0 if lost else self._close_timeout
        await asyncio.gather(*(p.close(timeout) for p in parts))

    async def drain(self) -> None:
        """Shutdown: accept nothing more, finish the batches in progress."""
        self._closed = True
        await self.revoke(list(self._partitions), lost=False)

    def failed(self) -> BaseException | None:
        for part in self._partitions.values():
            if part.task.done() and not part.task.cancelled() and part.task.exception():
                return part.task.exception()
        return None
