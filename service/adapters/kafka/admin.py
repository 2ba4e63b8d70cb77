"""What the operator tools and the worker ask the cluster outside the consume loop: a snapshot
of a topic, one record, a topic's size limit, a group's committed offsets and lag."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at run time
    AdminClient,
    ConfigResource,
    ResourceType,
)

from service.adapters.kafka.config import AUTHORIZATION_REFUSED

log = structlog.get_logger(__name__)


class TopicConfigRefused(Exception):
    """The broker refused to describe a topic's configuration (no DescribeConfigs ACL)."""


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


def topic_max_message_bytes(conf: dict[str, Any], topic: str,
                            timeout: float = 10.0) -> int | None:
    """The broker's ``max.message.bytes`` for ``topic`` (None when it cannot be read, e.g.
    while the broker is away). Raises ``TopicConfigRefused`` when the broker refuses: the
    principal lacks DescribeConfigs on the topic, a deployment error to fix, not to guess
    around."""
    admin = AdminClient(conf)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        config = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout)
        return int(config["max.message.bytes"].value)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.code() in AUTHORIZATION_REFUSED:
            raise TopicConfigRefused(
                f"DescribeConfigs on topic {topic}: {error.str()}") from None
        log.warning("topic_config_unreadable", topic=topic, error=str(exc)[:200])
        return None
    except (KeyError, ValueError, TypeError,
            concurrent.futures.TimeoutError) as exc:
        log.warning("topic_config_unreadable", topic=topic, error=str(exc)[:200])
        return None


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
