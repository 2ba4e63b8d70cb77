"""Batching across partitions keeps each partition's order and never runs one partition in
two batches at once; revoking drops what waits and lets what runs finish. No test waits a
fixed time: each waits for the event it needs (a message processed, a batch started)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from service.core.dispatcher import Dispatcher


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


class Processor:
    """Records what it processed; ``first`` (hang, fail) runs on the first call only."""

    def __init__(self, first: Callable[[], Awaitable[None]] | None = None) -> None:
        self.first = first
        self.calls = 0
        self.batches: list[list[Msg]] = []
        self.running: set[int] = set()
        self.overlaps = 0
        self.started = asyncio.Event()  # a first batch is running
        self._progress = asyncio.Condition()

    @property
    def done(self) -> list[Msg]:
        return [m for b in self.batches for m in b]

    async def process(self, msgs: Sequence[Msg]) -> None:
        self.calls += 1
        self.started.set()
        parts = {m.p for m in msgs}
        if parts & self.running:
            self.overlaps += 1
        self.running |= parts
        try:
            if self.calls == 1 and self.first is not None:
                await self.first()
            await asyncio.sleep(0)  # let other batches start meanwhile
        finally:
            self.running -= parts
        self.batches.append(list(msgs))
        async with self._progress:
            self._progress.notify_all()

    async def until_done(self, count: int) -> None:
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: len(self.done) >= count), 5)


async def test_order_per_partition_no_overlap_and_batches_across_partitions() -> None:
    processor = Processor()
    dispatcher = Dispatcher(processor, max_batch=7, close_timeout=5, max_in_flight=3)
    for chunk in range(20):  # whole fetches of four partitions, shared among three batches
        dispatcher.submit({("t", p): [Msg(p, chunk * 3 + i) for i in range(3)]
                           for p in range(4)})
        await asyncio.sleep(0)
    await processor.until_done(240)
    await dispatcher.drain()
    seen: dict[int, list[int]] = {}
    for m in processor.done:
        seen.setdefault(m.p, []).append(m.off)
    assert processor.overlaps == 0
    for p, offsets in seen.items():
        assert offsets == list(range(60)), p  # every message once, in offset order
    assert any(len({m.p for m in b}) > 1 for b in processor.batches), "batches span partitions"
    assert all(len(b) <= 7 for b in processor.batches)


async def test_everything_submitted_before_revoke_is_processed_or_dropped_never_twice() -> None:
    processor = Processor()
    dispatcher = Dispatcher(processor, max_batch=10, close_timeout=5)
    dispatcher.submit({("t", 0): [Msg(0, i) for i in range(50)]})
    await processor.started.wait()
    await dispatcher.revoke([("t", 0)], lost=False)
    processed = [m.off for m in processor.done]
    assert processed == list(range(len(processed)))  # a prefix, in order, once
    assert len(processed) < 50, "what waited was dropped"
    dispatcher.submit({("t", 0): [Msg(0, 50)]})
    await processor.until_done(len(processed) + 1)
    assert processor.done[-1].off == 50


async def test_a_bug_past_the_processor_is_reported_not_swallowed() -> None:
    async def bug() -> None:
        raise ValueError("bug")

    processor = Processor(bug)
    dispatcher = Dispatcher(processor, max_batch=10, close_timeout=1)
    dispatcher.submit({("t", 0): [Msg(0, 0)]})
    await processor.started.wait()
    await asyncio.sleep(0)  # the batch's task ends on the same loop turn
    assert isinstance(dispatcher.failed(), ValueError)


async def test_a_cancelled_batch_gives_back_the_partitions_it_keeps() -> None:
    """Revoking partition 0 while a batch holding partitions 0 and 1 is stuck: the batch is
    cancelled, partition 1's messages go back to its queue in order and are processed;
    nothing after them is processed first (or its offset would skip them)."""

    async def stuck() -> None:
        await asyncio.Event().wait()  # e.g. retrying against an unreachable database

    processor = Processor(stuck)
    dispatcher = Dispatcher(processor, max_batch=100, close_timeout=0.05, max_in_flight=1)
    dispatcher.submit({("t", 0): [Msg(0, 0), Msg(0, 1)]})
    dispatcher.submit({("t", 1): [Msg(1, 0), Msg(1, 1)]})
    await processor.started.wait()  # the first batch (both partitions) is stuck
    dispatcher.submit({("t", 1): [Msg(1, 2)]})
    await dispatcher.revoke([("t", 0)], lost=False)
    await processor.until_done(3)
    assert [(m.p, m.off) for m in processor.done] == [(1, 0), (1, 1), (1, 2)]


async def test_after_a_failed_batch_nothing_later_on_its_partitions_is_processed() -> None:
    """A batch that fails past the processor's own isolation stops the dispatcher: a later
    batch on the same partition would store an offset past the failed messages (a loss)."""

    async def fail() -> None:
        raise RuntimeError("unexpected")

    processor = Processor(fail)
    dispatcher = Dispatcher(processor, max_batch=2, close_timeout=1, max_in_flight=1)
    dispatcher.submit({("t", 0): [Msg(0, 0), Msg(0, 1), Msg(0, 2), Msg(0, 3)]})
    await processor.started.wait()
    await asyncio.sleep(0)
    dispatcher.submit({("t", 0): [Msg(0, 4)]})
    await asyncio.sleep(0)
    assert isinstance(dispatcher.failed(), RuntimeError)
    assert processor.done == [] and processor.calls == 1


async def test_the_age_of_the_oldest_unfinished_message_per_partition() -> None:
    async def stuck() -> None:
        await asyncio.Event().wait()

    processor = Processor(stuck)
    dispatcher = Dispatcher(processor, max_batch=10, close_timeout=0.05, max_in_flight=2)
    dispatcher.submit({("t", 0): [Msg(0, 0)]})
    await processor.started.wait()
    dispatcher.submit({("t", 1): [Msg(1, 0)]})
    await processor.until_done(1)  # partition 1 finished, partition 0 is stuck
    ages = dispatcher.oldest_unfinished()
    assert set(ages) == {("t", 0)} and ages[("t", 0)] >= 0
    await dispatcher.revoke([("t", 0)], lost=False)
    assert dispatcher.oldest_unfinished() == {}


async def test_a_cancelled_batch_gives_back_only_what_was_not_reported_finished() -> None:
    """The processor reports as it goes (each half of an isolated batch): what it reported
    finished is not processed again after a revoke cancels the batch."""
    reported: dict[tuple[str, int], int] = {}
    gate, stuck = asyncio.Event(), asyncio.Event()

    async def first_batch_waits_at_the_gate() -> None:
        await gate.wait()

    class HalfDoneThenStuck(Processor):
        async def process(self, msgs: Sequence[Msg]) -> None:
            if self.calls == 1 and {m.p for m in msgs} == {0, 1}:
                self.calls += 1
                reported[("t", 1)] = 2  # offsets 0 and 1 of partition 1: done, reported
                stuck.set()
                await asyncio.Event().wait()  # then stuck on the rest
            await super().process(msgs)

    processor = HalfDoneThenStuck(first_batch_waits_at_the_gate)
    dispatcher = Dispatcher(processor, finished_up_to=reported.get, max_batch=100,
                            close_timeout=0.05, max_in_flight=1)
    dispatcher.submit({("t", 2): [Msg(2, 0)]})  # in flight: the next batch takes 0 and 1 together
    await processor.started.wait()
    dispatcher.submit({("t", 0): [Msg(0, 0)]})
    dispatcher.submit({("t", 1): [Msg(1, 0), Msg(1, 1), Msg(1, 2)]})
    gate.set()
    await processor.until_done(1)
    await stuck.wait()
    await dispatcher.revoke([("t", 0)], lost=False)
    await processor.until_done(2)
    assert [(m.p, m.off) for m in processor.done] == [(2, 0), (1, 2)]


async def _hanging_first_batch(overlap_from: int, overlap_after: float
                               ) -> tuple[Processor, Dispatcher, asyncio.Event]:
    release = asyncio.Event()

    async def hang() -> None:
        await release.wait()

    processor = Processor(first=hang)
    dispatcher = Dispatcher(processor, max_batch=100, close_timeout=1, max_in_flight=3,
                            overlap_from=overlap_from, overlap_after=overlap_after)
    dispatcher.submit({("t", 0): [Msg(0, 0)]})
    await processor.started.wait()  # the first batch is in flight, hanging
    return processor, dispatcher, release


async def _nine_waiting(dispatcher: Dispatcher) -> None:
    for i in range(9):
        dispatcher.submit({("t", 1 + i % 3): [Msg(1 + i % 3, i // 3)]})
        await asyncio.sleep(0)


async def test_under_light_load_the_next_batch_waits_and_goes_as_one() -> None:
    processor, dispatcher, release = await _hanging_first_batch(10, overlap_after=60)
    await _nine_waiting(dispatcher)
    assert processor.calls == 1
    release.set()
    await processor.until_done(10)
    assert processor.calls == 2 and len(processor.batches[-1]) == 9
    await dispatcher.drain()


async def test_a_backlog_starts_a_second_batch_at_once() -> None:
    processor, dispatcher, release = await _hanging_first_batch(10, overlap_after=60)
    await _nine_waiting(dispatcher)
    dispatcher.submit({("t", 4): [Msg(4, 0)]})  # ten waiting: a backlog, overlap
    await processor.until_done(10)
    assert processor.calls == 2 and len(processor.batches[0]) == 10
    release.set()
    await processor.until_done(11)
    await dispatcher.drain()


async def test_a_slow_batch_does_not_hold_the_other_partitions_back() -> None:
    processor, dispatcher, release = await _hanging_first_batch(1000, overlap_after=0.01)
    dispatcher.submit({("t", 1): [Msg(1, 0)]})  # one message: no backlog, yet it goes
    await processor.until_done(1)
    assert processor.calls == 2 and [m.p for m in processor.done] == [1]
    release.set()
    await processor.until_done(2)
    await dispatcher.drain()


class Gated(Processor):
    """Every batch waits at the gate once started: what runs at once stays visible."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight: list[list[Msg]] = []

    async def process(self, msgs: Sequence[Msg]) -> None:
        self.in_flight.append(list(msgs))
        await self.gate.wait()
        await super().process(msgs)


def _fetch(partitions: int, each: int) -> dict[tuple[str, int], list[Msg]]:
    return {("t", p): [Msg(p, i) for i in range(each)] for p in range(partitions)}


async def _batches_started_by(fetch: dict[tuple[str, int], list[Msg]], *,
                              max_batch: int) -> list[list[Msg]]:
    """The batches one fetch starts at once (three may run, shares of at least 40), held at
    the gate; then released, so that every message is processed once."""
    processor = Gated()
    dispatcher = Dispatcher(processor, max_batch=max_batch, close_timeout=1, max_in_flight=3,
                            overlap_from=40)
    dispatcher.submit(fetch)  # starts its batches' tasks there and then
    await asyncio.sleep(0)  # one turn of the loop: each has run up to the gate
    started = list(processor.in_flight)
    processor.gate.set()
    await processor.until_done(sum(map(len, fetch.values())))
    await dispatcher.drain()
    return started


async def test_a_steady_loads_messages_are_shared_among_batches_that_run_at_once() -> None:
    running = await _batches_started_by(_fetch(12, 10), max_batch=1000)  # a few on each
    assert len(running) == 3, [len(b) for b in running]
    assert all(len(b) >= 40 for b in running) and sum(map(len, running)) == 120
    partitions = [{m.p for m in b} for b in running]
    assert sum(map(len, partitions)) == 12, "disjoint: a partition in one batch at a time"


async def test_too_few_to_share_go_as_one_batch_whatever_their_partitions() -> None:
    running = await _batches_started_by(_fetch(12, 6), max_batch=1000)  # under two shares
    assert [len(b) for b in running] == [72]


async def test_a_backlogs_batches_stay_full() -> None:
    running = await _batches_started_by(_fetch(3, 500), max_batch=100)
    assert [len(b) for b in running] == [100, 100, 100]
