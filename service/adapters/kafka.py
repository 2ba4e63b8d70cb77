"""Kafka I/O with confluent-kafka, kept off the event loop.

- ``ConsumerThread`` owns the ``Consumer``: it polls, hands each partition's messages to the
  asyncio side, stores the offsets of finished work, and answers rebalances. librdkafka
  calls are blocking, and a ``Consumer`` must only be used from one thread.
- ``Publisher`` wraps the thread-safe ``Producer``; a small thread serves its delivery
  reports, which resolve asyncio futures.

Offsets: ``enable.auto.offset.store=false``; an offset is stored only once the asyncio side
reports the work before it finished (committed, published, cached), and librdkafka's
auto-commit commits what was stored. On revoke and on shutdown we commit synchronously.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at run time
    AdminClient,
    ConfigResource,
    ResourceType,
)

from service import metrics
from service.config import Settings
from service.domain.errors import PublishFailed
from service.logs import RateLimitedLog, librdkafka_logger

log = structlog.get_logger(__name__)

TP = tuple[str, int]


def client_config(settings: Settings) -> dict[str, Any]:
    """Connection settings shared by consumer, producer and admin clients. librdkafka's own
    log lines go through the service's logging (JSON, rate-limited), never raw to stderr."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "security.protocol": settings.kafka_security_protocol,
        "client.id": f"payauth-{settings.instance_id()}",
        "logger": librdkafka_logger(settings.kafka_log_interval_seconds),
    }
    if settings.kafka_sasl_mechanism:
        conf["sasl.mechanism"] = settings.kafka_sasl_mechanism
        if settings.kafka_sasl_username:
            conf["sasl.username"] = settings.kafka_sasl_username
            conf["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    if settings.kafka_ssl_ca_location:
        conf["ssl.ca.location"] = settings.kafka_ssl_ca_location
    if settings.kafka_ssl_certificate_location:
        conf["ssl.certificate.location"] = settings.kafka_ssl_certificate_location
        conf["ssl.key.location"] = settings.kafka_ssl_key_location
        if settings.kafka_ssl_key_password.get_secret_value():
            conf["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    if settings.kafka_sasl_oauthbearer_method:
        conf["sasl.oauthbearer.method"] = settings.kafka_sasl_oauthbearer_method
    if settings.kafka_sasl_oauthbearer_method == "oidc":
        conf.update({
            "sasl.oauthbearer.client.id": settings.kafka_sasl_oauthbearer_client_id,
            "sasl.oauthbearer.client.secret":
                settings.kafka_sasl_oauthbearer_client_secret.get_secret_value(),
            "sasl.oauthbearer.token.endpoint.url":
                settings.kafka_sasl_oauthbearer_token_endpoint_url,
        })
        if settings.kafka_sasl_oauthbearer_scope:
            conf["sasl.oauthbearer.scope"] = settings.kafka_sasl_oauthbearer_scope
    return conf


def consumer_config(settings: Settings) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            "group.id": settings.group_id,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": settings.commit_interval_ms,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": settings.session_timeout_ms,
            "max.poll.interval.ms": settings.max_poll_interval_ms,
            # Bound what librdkafka prefetches (default 64 MiB): memory stays flat under lag.
            "queued.max.messages.kbytes": 16_384,
            "statistics.interval.ms": 5_000,
            "enable.partition.eof": False,
        }
    )
    if settings.group_instance_id:
        conf["group.instance.id"] = settings.group_instance_id
    return conf


def producer_config(settings: Settings) -> dict[str, Any]:
    conf = client_config(settings)
    conf.update(
        {
            # librdkafka's default is false: without it a retried send can duplicate or
            # reorder events.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "delivery.timeout.ms": settings.delivery_timeout_ms,
            # Stated, not left to the library's default: the dead-letter size cap reads it.
            "message.max.bytes": settings.kafka_message_max_bytes,
            "compression.type": "lz4",
        }
    )
    return conf


def read_snapshot(
    conf: dict[str, Any], topic: str, *, partitions: list[int] | None = None,
    from_offset: int = 0,
) -> list[Message]:
    """Every record of ``topic`` from ``from_offset`` (or the log start) up to each
    partition's end as it is when called: a consistent snapshot, for the operator tools."""
    consumer = Consumer({**conf, "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=15).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        wanted = sorted(meta.partitions) if partitions is None else partitions
        ends: dict[int, int] = {}
        assignment = []
        for p in wanted:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            start = max(low, from_offset)
            if high > start:
                ends[p] = high
                assignment.append(TopicPartition(topic, p, start))
        consumer.assign(assignment)
        records: list[Message] = []
        done: set[int] = set()
        while len(done) < len(assignment):
            for msg in consumer.consume(1000, timeout=1.0):
                partition, offset = msg.partition(), msg.offset()
                if partition is None or offset is None:
                    continue
                if msg.error() is None and offset < ends[partition]:
                    records.append(msg)
                if msg.error() is not None or offset + 1 >= ends[partition]:
                    done.add(partition)  # reached the snapshot's end (or the log's)
        return records
    finally:
        consumer.close()


def read_one(conf: dict[str, Any], topic: str, partition: int, offset: int,
             timeout: float = 15.0) -> Message | None:
    """The record at ``topic``/``partition``/``offset``, or None when it is not there (past
    the end, or deleted by retention)."""
    consumer = Consumer({**conf, "enable.auto.commit": False, "enable.partition.eof": True,
                         "receive.message.max.bytes": 200_000_000})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                return None  # end of partition (or an error): the record is not there
            return msg if msg.offset() == offset else None  # the log starts later now
        return None
    finally:
        consumer.close()


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | str | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


def topic_max_message_bytes(conf: dict[str, Any], topic: str,
                            timeout: float = 10.0) -> int | None:
    """The broker's ``max.message.bytes`` for ``topic`` (None when it cannot be read)."""
    admin = AdminClient(conf)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        config = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout)
        return int(config["max.message.bytes"].value)
    except (KafkaException, KeyError, ValueError, TypeError,
            concurrent.futures.TimeoutError) as exc:
        log.warning("topic_config_unreadable", topic=topic, error=str(exc)[:200])
        return None


# Refusals a record meets again whatever the retry: it is larger than a limit.
_SIZE_REFUSALS = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}


class _BatchAck:
    """Counts a batch's delivery reports in the delivery thread; wakes the event loop once,
    when the last one arrives (a wake-up per record would cost more than the record)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._remaining = count
        self._errors: list[str] = []
        self._too_large = False
        self.future: asyncio.Future[None] = loop.create_future()

    def on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        with self._lock:
            if err is not None:
                self._errors.append(err.str())
                self._too_large |= err.code() in _SIZE_REFUSALS
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self._errors:
            self.future.set_exception(PublishFailed(
                f"{len(self._errors)} record(s) not acknowledged: {self._errors[0]}",
                too_large=self._too_large))
        else:
            self.future.set_result(None)


# What a group coordinator answers while it moves or loads (right after a broker starts, the
# offsets topic is still being created): worth asking again.
COORDINATOR_NOT_READY = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
}


def committed_offsets(consumer: Consumer, tps: list[TopicPartition],
                      within_seconds: float = 60) -> dict[int, int]:
    """The group's committed offsets, asking again while the coordinator is not ready."""
    deadline = time.monotonic() + within_seconds
    while True:
        try:
            return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=15)}
        except KafkaException as exc:
            if exc.args[0].code() not in COORDINATOR_NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def group_lag(conf: dict[str, Any], group: str, topic: str) -> dict[int, int]:
    """Messages not yet committed by ``group``, per partition of ``topic`` (a partition the
    group never committed counts from its first message)."""
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=15).topics[topic]
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        committed = committed_offsets(consumer, tps)
        lag = {}
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=15)
            position = committed[tp.partition]
            lag[tp.partition] = max(0, high - (position if position >= 0 else low))
        return lag
    finally:
        consumer.close()


class Publisher:
    """Produce and await the broker's acknowledgements from asyncio."""

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop) -> None:
        self._producer = producer
        self._loop = loop
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-delivery", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.1)

    async def publish(self, records: Sequence[Record]) -> None:
        """Send every record; return once Kafka acknowledged all of them (``acks=all``), or
        raise ``PublishFailed`` if any was refused or timed out."""
        if not records:
            return
        ack = _BatchAck(self._loop, len(records))
        for record in records:
            headers: list[tuple[str, str | bytes | None]] | None = (
                list(record.headers) if record.headers is not None else None
            )
            while True:
                try:
                    self._producer.produce(record.topic, value=record.value, key=record.key,
                                           headers=headers, on_delivery=ack.on_delivery)
                    break
                except BufferError:
                    await asyncio.sleep(0.01)  # local queue full: let deliveries drain it
                except KafkaException as exc:
                    ack.on_delivery(exc.args[0], None)  # type: ignore[arg-type]  # refused: no Message
                    break
        await ack.future

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))

    def close(self, timeout: float = 10.0) -> None:
        remaining = self.flush(timeout)
        if remaining:
            log.warning("producer_unflushed", messages=remaining)
        self._stopping.set()
        self._thread.join(timeout=2)


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

    def done(self, tp: TP, next_offset: int, count: int) -> None:
        with self._lock:
            self._next[tp] = max(next_offset, self._next.get(tp, -1))
            self._count[tp] = self._count.get(tp, 0) + count

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


class Handoff:
    """What the consumer thread calls on the asyncio side (thread-safe entry points)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatcher: Any) -> None:
        self.loop = loop
        self.dispatcher = dispatcher

    def messages(self, tp: TP, msgs: list[Message]) -> None:
        self.loop.call_soon_threadsafe(self.dispatcher.submit, tp, msgs)

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
                log.warning("consumer_error", error=err.str())
                continue
            topic, partition = msg.topic(), msg.partition()
            assert topic is not None and partition is not None  # set on every consumed message
            by_tp.setdefault((topic, partition), []).append(msg)
        for tp, batch in by_tp.items():
            state = self._partitions.setdefault(tp, _PartitionState())
            state.in_flight += len(batch)
            self._handoff.messages(tp, batch)
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
            self._health.kafka_reachable(
                any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers))
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


__all__ = [
    "ConsumerThread",
    "Handoff",
    "OffsetTracker",
    "Publisher",
    "client_config",
    "consumer_config",
    "producer_config",
]
