"""Failover gaps: how long after a fault messages sent after it are decided again.

The observer samples the group's committed offsets (the last step of a batch: decided,
published, acknowledged) a few times a second from outside the workers, as an operator's
lag exporter would; the load generator's log says when each message was written. For each
fault, with each partition's last message written before the fault as the mark:

- *first commit*: seconds until a partition's committed offset passed its mark (a message
  sent after the fault was decided and committed: the service answers again, somewhere);
- *all partitions*: seconds until every partition's had (the last partition the fault held
  up is served again). Under a steady load every partition gets messages each second.

Both include the ordinary latency (batching, the 500 ms commit interval). Faults of the two
lanes overlap at times: a gap counts whatever else was happening too.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

Sample = tuple[float, dict[int, int]]  # (wall time, committed offset per partition)


@dataclass(frozen=True)
class Gap:
    first_commit: float | None  # None: nothing moved within the horizon
    all_partitions: float | None


def last_written(writes: list[tuple[float, int, int]], moment: float) -> dict[int, int]:
    """Per partition, the offset of the last message acknowledged at or before ``moment``
    (``writes``: (acknowledged at, partition, offset))."""
    out: dict[int, int] = {}
    for acked, partition, offset in writes:
        if acked <= moment and offset > out.get(partition, -1):
            out[partition] = offset
    return out


def gap_after(samples: list[Sample], start: float, horizon: float,
              marks: dict[int, int]) -> Gap:
    """The gap of a fault that began at ``start``: samples in time order, ``marks`` each
    partition's last offset written before the fault (a partition not named: none)."""
    first: float | None = None
    waiting = set(marks) | {p for _, offsets in samples for p in offsets}
    for t, offsets in samples:
        if t <= start or t > start + horizon:
            continue
        # a committed offset names the next message to read: past the mark means a
        # message written after the fault is done
        moved = {p for p in waiting if offsets.get(p, -1) > marks.get(p, -1) + 1}
        if moved and first is None:
            first = t - start
        waiting -= moved
        if not waiting:
            return Gap(first, t - start)
    return Gap(first, None)


def every_partition_committed(offsets: dict[int, int], partitions: int) -> bool:
    """A sample has a committed offset on each of ``partitions`` partitions (a partition
    never committed reads as a negative offset, librdkafka's OFFSET_INVALID)."""
    return all(offsets.get(p, -1) >= 0 for p in range(partitions))


def gaps_by_kind(samples: list[Sample], faults: list[tuple[str, float]],
                 writes: list[tuple[float, int, int]],
                 horizon: float = 120.0) -> dict[str, list[Gap]]:
    out: dict[str, list[Gap]] = {}
    for kind, start in faults:
        out.setdefault(kind, []).append(
            gap_after(samples, start, horizon, last_written(writes, start)))
    return out


def render(gaps: dict[str, list[Gap]], horizon: float = 120.0) -> list[str]:
    """One line per fault kind: median and worst of each gap, in seconds."""
    def stat(values: list[float | None]) -> str:
        if any(v is None for v in values):
            return f"{'>' + format(horizon, '.0f'):>7} {'':>6}"
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):>7.1f} {max(known):>6.1f}"

    lines = [f"  {'':<32}{'first commit (s)':>16}  {'all partitions (s)':>18}",
             f"  {'fault kind':<32}{'median':>8} {'worst':>7}  {'median':>9} {'worst':>7}"]
    for kind in sorted(gaps):
        first = stat([g.first_commit for g in gaps[kind]])
        every = stat([g.all_partitions for g in gaps[kind]])
        lines.append(f"  {kind:<32}{first}   {every}")
    return lines


class CommitObserver:
    """Samples ``group``'s committed offsets on ``topic`` every ``interval`` seconds in a
    thread (a consumer that never joins the group: it reads, it does not take part).

    A sample that fails replaces the client. A coordinator that went quiet (paused, cut
    off) holds the requests of a client that knows it until it answers again, whatever
    the group has done meanwhile: an observer that kept one client saw the commits of a
    group that had moved to a new coordinator only once the paused node woke, and charged
    the workers for the whole pause. A new client asks the cluster who coordinates now, as
    a lag exporter that asks afresh would."""

    def __init__(self, conf: dict[str, Any], group: str, topic: str, partitions: int,
                 interval: float = 0.25) -> None:
        self._conf = {**conf, "group.id": group, "enable.auto.commit": False}
        self._consumer = Consumer(self._conf)
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-observer", daemon=True)
        self.samples: list[Sample] = []
        self.clients_replaced = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                committed = self._consumer.committed(self._tps, timeout=2)
            except KafkaException:
                # no sample this time, which is the point; and a client that asks afresh
                self._replace_client()
            else:
                self.samples.append((time.time(),
                                     {tp.partition: tp.offset for tp in committed}))
            self._stop.wait(self._interval)

    def _replace_client(self) -> None:
        stuck, self._consumer = self._consumer, Consumer(self._conf)
        self.clients_replaced += 1
        # closed aside: a close may wait on the quiet broker, the samples must not
        threading.Thread(target=stuck.close, name="commit-observer-close",
                         daemon=True).start()

    def wait_all_committed(self, timeout: float) -> bool:
        """True once a sample has a committed offset on every partition (the group is at
        work everywhere), False if none has within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.samples and every_partition_committed(self.samples[-1][1],
                                                          len(self._tps)):
                return True
            self._stop.wait(self._interval)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def each_gap(starts: list[tuple[str, float]], gaps: dict[str, list[Gap]],
             started: float) -> list[str]:
    """One line per fault in time order: when it struck, its two gaps, and how long until
    the next fault struck (``gaps`` per kind in the order of ``starts``, as gaps_by_kind)."""
    nth: dict[str, int] = {}
    rows = []
    for kind, start in starts:
        gap = gaps[kind][nth.get(kind, 0)]
        nth[kind] = nth.get(kind, 0) + 1
        rows.append((start, kind, gap))
    rows.sort(key=lambda row: row[0])

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"
    lines = [f"  {'at (s)':>7}  {'fault kind':<28}{'first':>7}{'all':>7}{'next after':>12}"]
    for i, (start, kind, gap) in enumerate(rows):
        following = f"{rows[i + 1][0] - start:.1f}" if i + 1 < len(rows) else "-"
        lines.append(f"  {start - started:>7.0f}  {kind:<28}{seconds(gap.first_commit):>7}"
                     f"{seconds(gap.all_partitions):>7}{following:>12}")
    return lines
