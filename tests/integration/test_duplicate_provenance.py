"""Why duplicates came, through the real broker: the same message again (redelivery), the
gateway retrying with a new message_id (producer_retry), the same transaction on another
partition (cross_partition), a DLQ redrive (redrive) and an operator's replay (replay) are
each counted under their cause in ``payauth_duplicates_total{layer, cause}`` (queries on
``layer`` alone keep working), and ``payauth explain`` shows them per transaction."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until


def produce(topic: str, records: list[tuple[int, bytes, list[tuple[str, bytes]] | None]]) -> None:
    producer = Producer({"bootstrap.servers": stack.BOOTSTRAP, "enable.idempotence": True})
    errors: list[Any] = []
    for partition, value, headers in records:
        producer.produce(topic, key=b"k", value=value, partition=partition, headers=headers,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0 and not errors


def causes(worker: Any) -> dict[str, float]:
    m = worker.metrics()
    return {cause: m.get(f'payauth_duplicates_total{{cause="{cause}"}}', 0.0)
            for cause in ("redelivery", "producer_retry", "cross_partition", "replay",
                          "redrive")}


@pytest.mark.partitions(2)
def test_each_cause_is_counted_and_explained(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    txn = f"PROV-{uuid.uuid4().hex[:8]}"
    first = encode(auth_message(txn, account_id=account, message_id="msg-first"))
    produce(env.input_topic, [(0, first, None)])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    retried = encode(auth_message(txn, account_id=account, message_id="msg-retry"))
    produce(env.input_topic, [
        (0, first, None),  # the same message again
        (0, retried, None),  # the gateway's retry, new message_id
        (1, first, None),  # the same transaction on another partition
        (0, first, [("redrive.source", b"dlq/0/9"), ("redrive.reason", b"SCHEMA_VIOLATION")]),
    ])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: sum(causes(worker).values()) == 4, 20, "four duplicates counted")
    assert causes(worker) == {"redelivery": 1, "producer_retry": 1, "cross_partition": 1,
                              "replay": 0, "redrive": 1}
    m = worker.metrics()  # the contract's layer-only reading still adds up
    assert m['payauth_duplicates_total{layer="redis"}'] + \
        m['payauth_duplicates_total{layer="postgres"}'] == 4
    assert worker.terminate() == 0

    # An operator's rewind: every message re-read is a replay, whatever it was before.
    wait_until(lambda: "active member" not in payauth(env, "replay", "--to-earliest").stderr,
               60, "the group to have no members")
    done = payauth(env, "replay", "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    assert "2 replay mark(s) written" in done.stdout
    again = spawn_worker(env, "after-replay")
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: causes(again)["replay"] == 5, 20, "five replayed duplicates")
    assert sum(causes(again).values()) == 5
    assert again.terminate() == 0

    shown = payauth(env, "explain", txn)
    assert shown.returncode == 0, shown.stderr
    for cause, times in (("redelivery", 1), ("producer_retry", 1), ("cross_partition", 1),
                         ("redrive", 1), ("replay", 5)):
        assert f"{cause}: {times} time(s)" in shown.stdout, shown.stdout
