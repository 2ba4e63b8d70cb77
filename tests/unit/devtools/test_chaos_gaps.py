"""The chaos report's failover gaps: from samples of the group's committed offsets and the
load generator's writes, until messages written after a fault are decided and committed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from service.devtools.chaos import gaps as gaps_module
from service.devtools.chaos.gaps import (
    CommitObserver,
    Gap,
    every_partition_committed,
    gap_after,
    gaps_by_kind,
    last_written,
    render,
)


def samples(*rows: tuple[float, dict[int, int]]) -> list[tuple[float, dict[int, int]]]:
    return list(rows)


def test_the_mark_is_the_last_offset_written_before_the_fault() -> None:
    writes = [(1.0, 0, 10), (2.0, 0, 11), (2.5, 1, 4), (3.0, 0, 12)]
    assert last_written(writes, 2.5) == {0: 11, 1: 4}
    assert last_written(writes, 0.5) == {}


def test_only_messages_written_after_the_fault_count() -> None:
    # marks: partition 0 wrote up to offset 9, partition 1 up to 19 before the fault.
    # Committing offset 10 on partition 0 finishes work from before the fault: not a move.
    s = samples((0.0, {0: 5, 1: 15}), (1.0, {0: 10, 1: 20}), (2.0, {0: 11, 1: 20}),
                (4.5, {0: 11, 1: 21}))
    assert gap_after(s, 0.5, 120, {0: 9, 1: 19}) == Gap(first_commit=1.5, all_partitions=4.0)


def test_a_partition_that_never_moves_has_no_all_partitions_gap() -> None:
    s = samples((0.0, {0: 1, 1: 1}), (1.0, {0: 3, 1: 1}), (2.0, {0: 4, 1: 1}))
    assert gap_after(s, 0.0, 120, {0: 1, 1: 0}) == Gap(first_commit=1.0, all_partitions=None)


def test_moves_beyond_the_horizon_do_not_count() -> None:
    s = samples((0.0, {0: 1}), (200.0, {0: 5}))
    assert gap_after(s, 0.0, 120, {0: 0}) == Gap(None, None)


def test_a_partition_without_writes_before_the_fault_moves_with_its_first_commit() -> None:
    # -1001: the group never committed on partition 0 yet; no message was written there
    s = samples((0.0, {0: -1001, 1: 5}), (1.0, {0: 1, 1: 7}))
    assert gap_after(s, 0.0, 120, {1: 5}) == Gap(1.0, 1.0)


def test_the_faults_wait_for_a_commit_on_every_partition() -> None:
    # the group still forming: partition 2 never committed (-1001), partition 3 not listed
    assert not every_partition_committed({0: 4, 1: 0, 2: -1001, 3: 7}, 4)
    assert not every_partition_committed({0: 4, 1: 0, 2: 3}, 4)
    assert every_partition_committed({0: 4, 1: 0, 2: 3, 3: 7}, 4)


def test_gaps_group_by_kind_and_render_median_and_worst() -> None:
    writes = [(0.0, 0, 0), (9.5, 0, 1), (18.0, 0, 2)]
    s = samples((0.0, {0: 0}), (1.0, {0: 1}), (2.0, {0: 2}), (10.0, {0: 2}), (13.0, {0: 3}),
                (20.0, {0: 3}))
    gaps = gaps_by_kind(s, [("kill", 0.0), ("kill", 10.0), ("cut", 19.0)], writes)
    assert gaps["kill"] == [Gap(2.0, 2.0), Gap(3.0, 3.0)]
    assert gaps["cut"] == [Gap(None, None)]
    lines = render(gaps)
    kill = next(line for line in lines if line.strip().startswith("kill"))
    assert kill.split()[1:] == ["2.5", "3.0", "2.5", "3.0"]
    cut = next(line for line in lines if line.strip().startswith("cut"))
    assert ">120" in cut



def test_each_fault_is_listed_in_time_order_with_the_time_to_the_next() -> None:
    from service.devtools.chaos.gaps import each_gap

    # gaps per kind follow the order of the starts as given (gaps_by_kind's), the listing
    # the order of time
    lines = each_gap([("b", 15.0), ("a", 10.0), ("a", 40.0)],
                     {"a": [Gap(3.0, 4.0), Gap(None, None)], "b": [Gap(30.0, 31.0)]}, 0.0)
    assert [line.split() for line in lines[1:]] == [
        ["10", "a", "3.0", "4.0", "5.0"],
        ["15", "b", "30.0", "31.0", "25.0"],
        ["40", "a", "-", "-", "-"],
    ]


class _QuietCoordinator:
    """A client whose coordinator went quiet: every committed() times out, for good (a
    client of librdkafka keeps asking the node it knows)."""
    closed = 0

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def close(self) -> None:
        type(self).closed += 1


class _NewCoordinator(_QuietCoordinator):
    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in tps]


def test_the_observer_asks_with_a_new_client_after_a_failed_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The first client is stuck on a quiet coordinator; its successor finds the new one.
    # An observer that kept the first client would sample nothing until the quiet node
    # woke, and charge the workers for it.
    made = iter([_QuietCoordinator, _NewCoordinator])
    monkeypatch.setattr(gaps_module, "Consumer", lambda conf: next(made)(conf))
    observer = CommitObserver({}, "g", "t", 2, interval=0.01)
    observer.start()
    deadline = time.monotonic() + 5
    while not observer.samples and time.monotonic() < deadline:
        time.sleep(0.01)
    observer.stop()
    assert observer.samples and observer.samples[0][1] == {0: 7, 1: 7}
    assert observer.clients_replaced == 1
    assert _QuietCoordinator.closed >= 1  # the stuck client closed (aside), not leaked
