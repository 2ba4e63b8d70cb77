"""Kafka's own latency floor for the benchmark: a bare relay, run as a process of its own.

It does what the worker does with Kafka and nothing else: consume a batch (poll for the
first message, then take what is already fetched), produce one small event per message
(keyed, ``acks=all``, idempotent), wait for every acknowledgement, store the offsets and
let them be committed. No Redis, no PostgreSQL, no validation. The produce → event latency
through it, at the same steady rate as through payauth, is the floor payauth's latency is
held against (``kafka_floor_p99_ms``).

    python -m service.devtools.bench.relay INPUT OUTPUT GROUP   (until SIGTERM)

The Kafka settings are the worker's own (``service.adapters.kafka.config`` from the
``PAYAUTH_*`` environment), so the floor is the same Kafka work with the same clients.
"""

from __future__ import annotations

import signal
import sys

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from service.adapters.kafka.config import consumer_config, producer_config
from service.config import load_settings


def relay(source: str, target: str, group: str) -> int:
    settings = load_settings().model_copy(update={"group_id": group})
    consumer = Consumer(consumer_config(settings))
    producer = Producer(producer_config(settings))
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    consumer.subscribe([source])
    print("relay ready", flush=True)
    while not stopping:
        first = consumer.poll(0.2)
        if first is None:
            continue
        batch = [first, *consumer.consume(999, timeout=0)]
        done: dict[int, int] = {}
        for msg in batch:
            if msg.error() is not None:
                continue
            txn = orjson.loads(msg.value() or b"{}").get("body", {}).get("transaction_id")
            producer.produce(target, key=msg.key(),
                             value=orjson.dumps({"transaction_id": txn}))
            done[msg.partition() or 0] = msg.offset() or 0
        if producer.flush(30) != 0:
            return 1  # not acknowledged: never store an offset past it
        consumer.store_offsets(offsets=[TopicPartition(source, p, o + 1)
                                        for p, o in done.items()])
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(relay(*sys.argv[1:4]))
