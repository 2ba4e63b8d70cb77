"""Batching across partitions keeps each partition's order and never runs one partition in
two batches at once; revoking drops what waits and lets what runs finish."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from service.adapters.kafka import OffsetTracker
from service.dispatcher import Dispatcher


@dataclass(frozen=True)
class Msg:
    p: int
    off: int

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.off


class FirstCallThenDone:
    """A processor whose first call runs ``first`` (hang, fail); later calls succeed."""

    def __init__(self, first: Callable[[], Awaitable[None]]) -> None:
        self.first = first
        self.calls = 0
        self.done: list[Msg] = []

    async def process(self, msgs: Sequence[Msg]) -> None:
        self.calls += 1
        if self.calls == 1:
            await self.first()
        self.done.extend(msgs)


class Recorder:
    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.batches: list[list[Msg]] = []
        self.running: set[int] = set()
        self.overlaps = 0

    async def process(self, msgs: Sequence[Msg]) -> None:
        parts = {m.p for m in msgs}
        if parts & self.running:
            self.overlaps += 1
        self.running |= parts
        await asyncio.sleep(self.delay)
        self.running -= parts
        self.batches.append(list(msgs))


async def test_order_per_partition_no_overlap_and_offsets() -> None:
    recorder, tracker = Recorder(), OffsetTracker()
    dispatcher = Dispatcher(recorder, tracker, max_batch=7, close_timeout=5, max_in_flight=3)
    for chunk in range(20):
        for p in range(4):
            dispatcher.submit(("t", p), [Msg(p, chunk * 3 + i) for i in range(3)])
        await asyncio.sleep(0.001)
    await dispatcher.drain()  # returns once the batches in flight have finished
    assert not recorder.running
    seen: dict[int, list[int]] = {}
    for batch in recorder.batches:
        for m in batch:
            seen.setdefault(m.p, []).append(m.off)
    assert recorder.overlaps == 0
    for p, offsets in seen.items():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), p
    assert any(len({m.p for m in b}) > 1 for b in recorder.batches), "batches span partitions"
    assert all(len(b) <= 7 for b in recorder.batches)
    nexts, counts = tracker.drain()
    for (_, p), next_offset in nexts.items():
        assert next_offset == seen[p][-1] + 1
        assert counts[("t", p)] == len(seen[p])


async def test_everything_submitted_before_drain_is_processed_or_dropped_never_twice() -> None:
    recorder, tracker = Recorder(delay=0.01), OffsetTracker()
    dispatcher = Dispatcher(recorder, tracker, max_batch=100, close_timeout=5)
    dispatcher.submit(("t", 0), [Msg(0, i) for i in range(50)])
    await asyncio.sleep(0)
    await dispatcher.revoke([("t", 0)], lost=False)
    processed = [m.off for b in recorder.batches for m in b]
    assert processed == list(range(len(processed)))  # a prefix, in order, once
    dispatcher.submit(("t", 0), [Msg(0, 50)])
    await asyncio.sleep(0.05)
    assert [m.off for b in recorder.batches for m in b][-1] == 50


async def test_a_bug_in_processing_is_reported_not_swallowed() -> None:
    class Broken:
        async def process(self, msgs: Sequence[Msg]) -> None:
            raise ValueError("bug")

    dispatcher = Dispatcher(Broken(), OffsetTracker(), max_batch=10, close_timeout=1)
    dispatcher.submit(("t", 0), [Msg(0, 0)])
    await asyncio.sleep(0.01)
    assert isinstance(dispatcher.failed(), ValueError)


async def test_a_cancelled_batch_gives_back_the_partitions_it_keeps() -> None:
    """Revoking partition 0 while a batch holding partitions 0 and 1 is stuck: the batch is
    cancelled, partition 1's messages go back to its queue in order and are processed;
    nothing after them is processed first (or its offset would skip them)."""

    async def stuck() -> None:
        await asyncio.sleep(3600)  # e.g. retrying against an unreachable database

    processor, tracker = FirstCallThenDone(stuck), OffsetTracker()
    dispatcher = Dispatcher(processor, tracker, max_batch=100, close_timeout=0.05,
                            max_in_flight=1)
    dispatcher.submit(("t", 0), [Msg(0, 0), Msg(0, 1)])
    dispatcher.submit(("t", 1), [Msg(1, 0), Msg(1, 1)])
    await asyncio.sleep(0.01)  # the first batch (both partitions) is stuck
    dispatcher.submit(("t", 1), [Msg(1, 2)])
    await dispatcher.revoke([("t", 0)], lost=False)
    await asyncio.sleep(0.05)
    assert [(m.p, m.off) for m in processor.done] == [(1, 0), (1, 1), (1, 2)]
    nexts, _ = tracker.drain()
    assert nexts == {("t", 1): 3}


async def test_after_a_failed_batch_nothing_later_on_its_partitions_is_processed() -> None:
    """A batch that fails with an unexpected error stops the dispatcher: a later batch on the
    same partition would store an offset past the failed messages (a loss)."""

    async def fail() -> None:
        raise RuntimeError("unexpected")

    processor, tracker = FirstCallThenDone(fail), OffsetTracker()
    dispatcher = Dispatcher(processor, tracker, max_batch=2, close_timeout=1, max_in_flight=1)
    dispatcher.submit(("t", 0), [Msg(0, 0), Msg(0, 1), Msg(0, 2), Msg(0, 3)])
    await asyncio.sleep(0.05)
    dispatcher.submit(("t", 0), [Msg(0, 4)])
    await asyncio.sleep(0.05)
    assert isinstance(dispatcher.failed(), RuntimeError)
    assert processor.done == []
    assert tracker.drain() == ({}, {})
