"""The publisher against the real broker: a batch of events goes in one call per topic and
every record is acknowledged and on its topic, in order, also when the producer's local queue
has room for only a few of them at a time (the rest are queued again as deliveries drain it,
so that order is then only the order in which room was found)."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer

from service.adapters.kafka.config import producer_config
from service.adapters.kafka.publisher import Publisher
from service.config import load_settings
from service.core.ports import PublishFailed, Record
from tests.support import stack


def _publish(records: list[Record], **conf: object) -> None:
    async def go() -> None:
        settings = load_settings(kafka_bootstrap_servers=stack.BOOTSTRAP)
        publisher = Publisher(Producer({**producer_config(settings), **conf}),
                              asyncio.get_running_loop())
        try:
            await publisher.publish(records)
        finally:
            publisher.close()

    asyncio.run(go())


@pytest.mark.partitions(1)
@pytest.mark.parametrize("queue", [100_000, 7], ids=["room", "queue-of-7"])
def test_every_record_is_acknowledged_and_on_its_topic_in_order(env: stack.Env,
                                                                queue: int) -> None:
    events = [Record(env.output_topic, f"ACC-{i % 3}", f"event-{i}".encode())
              for i in range(250)]
    letters = [Record(env.dlq_topic, "k", f"letter-{i}".encode(), [("reason", b"TEST")])
               for i in range(3)]
    _publish([*events[:100], letters[0], *events[100:], *letters[1:]],
             **{"queue.buffering.max.messages": queue})
    out = [(m.key(), m.value()) for m in stack.read_topic(env.output_topic, expect=250)]
    sent = [(str(e.key).encode(), e.value) for e in events]
    assert out == sent if queue > len(events) else sorted(out) == sorted(sent)
    dlq = stack.read_topic(env.dlq_topic, expect=3)
    assert [m.value() for m in dlq] == [r.value for r in letters]
    assert all(m.headers() == [("reason", b"TEST")] for m in dlq)


def test_a_record_the_broker_refuses_fails_the_batch(env: stack.Env) -> None:
    too_large = Record(env.output_topic, "k", b"x" * 2_000_000)
    with pytest.raises(PublishFailed, match="not acknowledged"):
        _publish([Record(env.output_topic, "k", b"fine"), too_large])


@pytest.mark.parametrize("topic", ["no such topic!", "t" * 600],
                         ids=["refused-by-the-broker", "refused-before-queuing"])
def test_a_topic_kafka_cannot_have_fails_the_batch(env: stack.Env, topic: str) -> None:
    with pytest.raises(PublishFailed, match="not acknowledged"):
        _publish([Record(env.output_topic, "k", b"fine"), Record(topic, "k", b"x")])
