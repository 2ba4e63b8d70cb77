"""A steady load and its latency, as a payment gateway sees it: produce → result event.

``PacedLoad`` sends authorizations at a given rate for a given time (a *step*) and a reader
thread, outside the process under test, times each result event on the output topic. Each
latency counts for the step its message was sent in. ``sustainable_rate`` steps the rate
up and down to find the highest one whose p99 stays within a bound over the window.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from service.devtools.bench import cpu

# records(n, tag) → n (key, value) records, fresh transaction ids
RecordMaker = Callable[[int, str], list[tuple[str, bytes]]]


@dataclass(frozen=True)
class Step:
    rate_per_s: float
    seconds: float
    samples: int
    missing: int  # sent in this step, no event within the wait after it
    p50_ms: float
    p99_ms: float
    # Cores busy on average while the step sent (``cpu.cores``): the process under test,
    # PostgreSQL, the broker, Redis, this process, the machine.
    cores: dict[str, float] = field(default_factory=dict)
    # The time each kind's threads waited for a core per unit they ran (``cpu.waiting``).
    waiting: dict[str, float] = field(default_factory=dict)

    def within(self, p99_bound_ms: float) -> bool:
        return self.missing == 0 and self.p99_ms <= p99_bound_ms

    def as_json(self) -> dict[str, object]:
        return {"rate_per_s": round(self.rate_per_s, 1), "p50_ms": round(self.p50_ms, 2),
                "p99_ms": round(self.p99_ms, 2), "samples": self.samples,
                "missing": self.missing, "cores": self.cores,
                "waiting": self.waiting}


class PacedLoad:
    def __init__(self, bootstrap: str, topic: str, output: str, partitions: int,
                 records: RecordMaker, *, name: str, under_test: int) -> None:
        """``under_test``: the pid of the process the load goes through, for ``Step.cores``."""
        self._topic, self._records, self._name = topic, records, name
        self._under_test = under_test
        self._sent: dict[str, tuple[float, int]] = {}  # transaction_id → (sent at, step)
        self._latencies: dict[int, list[float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._steps = 0
        # Assigned at the end, not subscribed: no group to join, and reading starts at once,
        # so the first events are not measured late.
        self._consumer = Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": f"lat-reader-{name}",
                                   "enable.auto.commit": False})
        self._consumer.assign([TopicPartition(output, p, OFFSET_END)
                               for p in range(partitions)])
        self._reader = threading.Thread(target=self._receive, daemon=True)
        self._reader.start()
        # A gateway batches its sends for a few milliseconds, as librdkafka does by default
        # (linger.ms 5); 0 would cost the broker, on the same cores, a request per message.
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                   "enable.idempotence": True})
        time.sleep(2)  # the reader's assignment settles before anything is sent

    def _receive(self) -> None:
        while not self._stop.is_set():
            # poll() returns on the first event; consume() would wait out its timeout to
            # fill a batch and add that wait to every latency measured.
            first = self._consumer.poll(0.2)
            batch = [first, *self._consumer.consume(1000, timeout=0)] if first else []
            now = time.monotonic()
            with self._lock:
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    txn = json.loads(msg.value() or b"{}").get("transaction_id")
                    found = self._sent.pop(txn, None)
                    if found is not None:
                        at, step = found
                        self._latencies[step].append(now - at)
        self._consumer.close()

    def step(self, rate: float, seconds: float, *, wait_seconds: float = 60) -> Step:
        """Send at ``rate`` for ``seconds``, then wait (up to ``wait_seconds``) for every
        event of the step; what has not come by then counts as missing."""
        number = self._steps
        self._steps += 1
        records = self._records(max(1, int(rate * seconds)), f"{self._name[:2]}{number}")
        ids = [json.loads(value)["body"]["transaction_id"] for _, value in records]
        with self._lock:
            self._latencies[number] = []
        before = cpu.snapshot(self._under_test)
        started = time.monotonic()
        for i, (key, value) in enumerate(records):
            # Paced in 5 ms ticks: sleeping between small bursts keeps this process off the
            # CPU the process under test needs (a busy wait would take a whole core of two).
            due = started + i / rate
            if (delay := due - time.monotonic()) > 0.005:
                time.sleep(delay)
            with self._lock:
                self._sent[ids[i]] = (time.monotonic(), number)
            self._producer.produce(self._topic, key=key, value=value)
            self._producer.poll(0)
        self._producer.flush(30)
        after = cpu.snapshot(self._under_test)
        cores, waiting = cpu.cores(before, after), cpu.waiting(before, after)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            with self._lock:
                pending = sum(1 for _, s in self._sent.values() if s == number)
            if not pending:
                break
            time.sleep(0.2)
        with self._lock:
            values = sorted(self._latencies.pop(number))
            missing = [t for t, (_, s) in self._sent.items() if s == number]
            for t in missing:  # never counted later, in another step
                del self._sent[t]
        if not values:
            return Step(rate, seconds, 0, len(missing), float("inf"), float("inf"), cores,
                        waiting)
        return Step(rate, seconds, len(values), len(missing),
                    statistics.median(values) * 1000,
                    values[int(0.99 * (len(values) - 1))] * 1000, cores, waiting)

    def close(self) -> None:
        self._stop.set()
        self._reader.join(10)
        self._producer.flush(10)


def sustainable_rate(load: PacedLoad, start: float, *, p99_bound_ms: float, seconds: float,
                     refinements: int, log: Callable[[str], None]
                     ) -> tuple[Step | None, list[Step]]:
    """The highest rate whose p99 stays within the bound over ``seconds``: from ``start``,
    up by 1.4x while within it (down by 1.6x while not), then ``refinements`` bisections
    between the last rate within and the first beyond. Returns that step (None: not even
    the lowest rate tried) and every step, for the curve."""
    tried: list[Step] = []

    def probe(rate: float) -> Step:
        result = load.step(rate, seconds)
        tried.append(result)
        log(f"  {rate:,.0f} auth/s: p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms"
            f"{f', {result.missing} missing' if result.missing else ''} -> "
            f"{'within' if result.within(p99_bound_ms) else 'beyond'} {p99_bound_ms:.0f} ms")
        return result

    good: Step | None = None
    bad: Step | None = None
    rate = start
    for _ in range(8):
        result = probe(rate)
        if result.within(p99_bound_ms):
            good = result
            if bad is not None:
                break
            rate *= 1.4
        else:
            bad = result
            if good is not None:
                break
            rate /= 1.6
    for _ in range(refinements if good is not None and bad is not None else 0):
        assert good is not None and bad is not None
        result = probe((good.rate_per_s * bad.rate_per_s) ** 0.5)
        if result.within(p99_bound_ms):
            good = result
        else:
            bad = result
    return good, tried
