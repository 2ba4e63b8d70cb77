"""Create the service's topics (input, output, dead-letter) if they are missing."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported from cimpl at run time

from service.adapters.kafka.admin import committed_offsets
from service.adapters.kafka.config import client_config
from service.config import Settings


def wait_for_broker(admin: AdminClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=5)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise


def ensure_topics(
    settings: Settings, *, partitions: int = 12, wait_seconds: float = 60
) -> list[str]:
    """Create what is missing; return the names created."""
    admin = AdminClient(client_config(settings))
    wait_for_broker(admin, wait_seconds)
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [
        NewTopic(settings.input_topic, num_partitions=partitions, replication_factor=-1),
        NewTopic(settings.output_topic, num_partitions=partitions, replication_factor=-1),
        NewTopic(settings.dlq_topic, num_partitions=partitions, replication_factor=-1),
    ]
    missing = [t for t in wanted if t.topic not in existing]
    created = _create(admin, missing)
    wait_for_group_coordinator(settings, wait_seconds)
    return created


def wait_for_group_coordinator(settings: Settings, wait_seconds: float) -> None:
    """Consumer groups work only once the broker's offsets topic exists and is loaded; on a
    fresh broker that takes a few seconds after the first group request. Asking once here
    makes `make stack-up` return with groups ready."""
    consumer = Consumer({**client_config(settings), "group.id": "payauth-stack-probe"})
    try:
        committed_offsets(consumer, [TopicPartition(settings.input_topic, 0)],
                          within_seconds=wait_seconds)
    finally:
        consumer.close()


def _create(admin: AdminClient, missing: list[NewTopic]) -> list[str]:
    created = []
    if missing:
        for name, future in admin.create_topics(missing, operation_timeout=30).items():
            try:
                future.result()
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    return created


__all__ = ["NewTopic", "ensure_topics", "wait_for_broker", "wait_for_group_coordinator"]
