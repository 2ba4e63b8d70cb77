"""The consumer side, on a thread of its own: ``ConsumerThread`` owns the ``Consumer`` (a
``Consumer`` must only be used from one thread, and librdkafka calls block), polls, hands
each partition's messages to the asyncio side through ``Handoff``, stores the offsets of
finished work reported to the ``OffsetTracker``, and answers rebalances.

Offsets (step 5 of the commit order, ``service/core/pipeline.py``): ``enable.auto.offset.store``
is off; an offset is stored only once the asyncio side reports the work before it finished
(committed, published), and librdkafka's auto-commit commits what was stored. On revoke and
on shutdown we commit synchronously.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from service import metrics
from service.adapters.kafka.config import (
    AUTHENTICATION_REFUSED,
    AUTHORIZATION_REFUSED,
    consumer_config,
)
from service.config import Settings
from service.core.ports import TP
from service.logs import RateLimitedLog

log = structlog.get_logger(__name__)


@dataclass
class _PartitionState:
    in_flight: int = 0  # handed to asyncio, not yet finished
    paused: bool = False
    stored: int | None = None  # last offset stored for commit


class OffsetTracker:
    """Finished work reported by asyncio, waiting for the consumer thread to store it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[TP, int] = {}
        self._count: dict[TP, int] = {}
        self._reported: dict[TP, int] = {}  # the highest next offset ever reported

    def done(self, tp: TP, next_offset: int, count: int) -> None:
        with self._lock:
            self._next[tp] = max(next_offset, self._next.get(tp, -1))
            self._count[tp] = self._count.get(tp, 0) + count
            self._reported[tp] = max(next_offset, self._reported.get(tp, -1))

    def reported(self, tp: TP) -> int | None:
        """The offset up to which ``tp``'s work was reported finished (None: nothing yet)."""
        with self._lock:
            return self._reported.get(tp)

    def drain(self, only: Iterable[TP] | None = None) -> tuple[dict[TP, int], dict[TP, int]]:
        with self._lock:
            keys = list(self._next) if only is None else [k for k in only if k in self._next]
            nexts = {k: self._next.pop(k) for k in keys}
            counts = {k: self._count.pop(k, 0) for k in keys}
            return nexts, counts

    def forget(self, tps: Iterable[TP]) -> None:
        with self._lock:
            for tp in tps:
                self._next.pop(tp, None)
                self._count.pop(tp, None)
                self._reported.pop(tp, None)


class Handoff:
    """What the consumer thread calls on the asyncio side (thread-safe entry points)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatcher: Any) -> None:
        self.loop = loop
        self.dispatcher = dispatcher

    def messages(self, arrived: dict[TP, list[Message]]) -> None:
        """One fetch's messages, per partition, in one call (one wake-up of the loop)."""
        self.loop.call_soon_threadsafe(self.dispatcher.submit, arrived)

    def revoke(self, tps: list[TP], timeout: float, *, lost: bool) -> None:
        future = asyncio.run_coroutine_threadsafe(
            self.dispatcher.revoke(tps, lost=lost), self.loop
        )
        try:
            future.result(timeout)
        except Exception as exc:  # timed out or failed: the next owner replays, safely
            log.warning("revoke_wait_incomplete", partitions=tps, error=repr(exc))


class ConsumerThread(threading.Thread):
    def __init__(
        self,
        settings: Settings,
        handoff: Handoff,
        tracker: OffsetTracker,
        health: Any,
        *,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
    ) -> None:
        super().__init__(name="kafka-consumer", daemon=True)
        self._settings = settings
        self._handoff = handoff
        self._tracker = tracker
        self._health = health
        self._conf = consumer_config(settings)
        self._conf["stats_cb"] = self._on_stats
        self._conf["error_cb"] = self._on_error
        self._error_lines = RateLimitedLog(log, settings.kafka_log_interval_seconds)
        self._consumer = consumer_factory(self._conf)
        self._stopping = threading.Event()
        self._partitions: dict[TP, _PartitionState] = {}
        self.fatal: BaseException | None = None
        self.stopped = threading.Event()

    # ----------------------------------------------------------------- public
    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            self._consumer.subscribe(
                [self._settings.input_topic],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stopping.is_set():
                self._health.consumer_heartbeat()
                self._store_finished()
                # poll() returns as soon as one message is there (consume() would wait out
                # its timeout to fill a batch: latency); then take what is already fetched.
                first = self._consumer.poll(0.2)
                if first is not None:
                    rest = self._consumer.consume(
                        num_messages=self._settings.max_batch_size - 1, timeout=0
                    )
                    self._hand_off([first, *rest])
        except BaseException as exc:
            self.fatal = exc
            log.error("consumer_thread_failed", error=repr(exc))
        finally:
            self._shutdown()
            self.stopped.set()

    # --------------------------------------------------------------- internals
    def _hand_off(self, msgs: list[Message]) -> None:
        by_tp: dict[TP, list[Message]] = {}
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                if err.code() in AUTHORIZATION_REFUSED:
                    # Reported once by librdkafka, then retried in silence: the refusal
                    # stays in /readyz (and the log, once per interval) until an
                    # assignment shows the ACL is there.
                    self._health.refused("kafka consumer", err.str())
                else:
                    log.warning("consumer_error", error=err.str())
                continue
            topic, partition = msg.topic(), msg.partition()
            assert topic is not None and partition is not None  # set on every consumed message
            by_tp.setdefault((topic, partition), []).append(msg)
        if by_tp:  # read-only from here on, on both threads
            self._handoff.messages(by_tp)
        for tp, batch in by_tp.items():
            state = self._partitions.setdefault(tp, _PartitionState())
            state.in_flight += len(batch)
            if state.in_flight >= self._settings.max_in_flight_per_partition and not state.paused:
                # Backpressure: the asyncio side is behind (or PostgreSQL is down). Stop
                # fetching this partition but keep polling, so the group keeps us.
                self._consumer.pause([TopicPartition(*tp)])
                state.paused = True
                log.info("partition_paused", partition=tp[1], in_flight=state.in_flight)

    def _store_finished(self, only: Iterable[TP] | None = None) -> list[TopicPartition]:
        nexts, counts = self._tracker.drain(only)
        stored = []
        for tp, offset in nexts.items():
            state = self._partitions.get(tp)
            if state is None:
                continue  # no longer ours
            state.in_flight = max(0, state.in_flight - counts.get(tp, 0))
            tpo = TopicPartition(tp[0], tp[1], offset)
            try:
                self._consumer.store_offsets(offsets=[tpo])
                state.stored = offset
                stored.append(tpo)
            except KafkaException as exc:
                # _STATE: the partition was revoked meanwhile; the next owner replays.
                log.warning("store_offsets_failed", partition=tp[1], error=str(exc))
            limit = self._settings.max_in_flight_per_partition
            if state.paused and state.in_flight < max(1, limit // 2):
                self._consumer.resume([TopicPartition(*tp)])
                state.paused = False
                log.info("partition_resumed", partition=tp[1])
        return stored

    def _stored_positions(self, tps: Iterable[TP]) -> list[TopicPartition]:
        out = []
        for tp in tps:
            state = self._partitions.get(tp)
            if state is not None and state.stored is not None:
                out.append(TopicPartition(tp[0], tp[1], state.stored))
        return out

    def _commit_sync(self, offsets: list[TopicPartition]) -> None:
        if not offsets:
            return
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit_failed", error=str(exc))
            return
        for tp in result or []:
            if tp.error is not None:
                log.warning("commit_failed", partition=tp.partition, error=str(tp.error))

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._partitions[(tp.topic, tp.partition)] = _PartitionState()
        self._health.set_assigned(list(self._partitions))
        metrics.assigned_partitions.set(len(self._partitions))
        if partitions:  # the group and the topic let us in
            self._health.accepted("kafka consumer")
        log.info("partitions_assigned", partitions=sorted(tp.partition for tp in partitions))

    def _release(self, partitions: list[TopicPartition], *, lost: bool) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        # Let in-flight work on these partitions finish (bounded), then store and commit
        # exactly what finished. Work not finished is replayed by the next owner: safe.
        self._handoff.revoke(tps, self._settings.shutdown_timeout_seconds, lost=lost)
        if lost:
            self._tracker.forget(tps)  # another member owns them now: commit nothing
        else:
            self._store_finished(only=tps)
            self._commit_sync(self._stored_positions(tps))
        for tp in tps:
            self._partitions.pop(tp, None)
            with contextlib.suppress(KeyError):
                metrics.consumer_lag.remove(str(tp[1]))
            with contextlib.suppress(KeyError):
                metrics.oldest_unfinished_seconds.remove(str(tp[1]))
        self._health.set_assigned(list(self._partitions))
        metrics.assigned_partitions.set(len(self._partitions))
        log.info("partitions_revoked", partitions=sorted(p for _, p in tps), lost=lost)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, lost=False)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, lost=True)

    def _on_stats(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
            brokers = stats.get("brokers", {}).values()
            up = any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers)
            self._health.kafka_reachable(up)
            if up:  # a broker took our credentials and certificate
                self._health.accepted("kafka connection")
            topic = stats.get("topics", {}).get(self._settings.input_topic, {})
            for pid, part in topic.get("partitions", {}).items():
                lag = part.get("consumer_lag", -1)
                if lag < 0 and part.get("hi_offset", -1) >= 0 and \
                        part.get("hi_offset") == part.get("lo_offset"):
                    lag = 0  # an empty partition: nothing to consume, librdkafka says -1
                owned = (self._settings.input_topic, int(pid)) in self._partitions
                if int(pid) >= 0 and owned and lag >= 0:
                    metrics.consumer_lag.labels(pid).set(lag)
        except (ValueError, AttributeError, TypeError) as exc:
            log.debug("stats_unreadable", error=str(exc))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("kafka_fatal_error", error=err.str())
            self.fatal = KafkaException(err)
            self._stopping.set()
        elif err.code() in AUTHENTICATION_REFUSED:
            self._health.refused("kafka connection", err.str())
        elif err.code() in AUTHORIZATION_REFUSED:
            self._health.refused("kafka consumer", err.str())
        else:
            # Broker down, connection refused...: librdkafka retries by itself, and says so
            # many times a second; one line per kind of error per interval is enough.
            self._error_lines.emit(f"kafka_error:{err.code()}", "kafka_error",
                                   error=err.str())

    def _shutdown(self) -> None:
        """Finish: in-flight work is awaited by the caller before ``stop()``; here we store
        what finished, commit it synchronously, and leave the group."""
        try:
            self._store_finished()
            self._commit_sync(self._stored_positions(list(self._partitions)))
            self._consumer.close()
            log.info("consumer_closed")
        except Exception as exc:
            log.warning("consumer_close_failed", error=repr(exc))
