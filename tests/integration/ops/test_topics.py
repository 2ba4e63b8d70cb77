"""``payauth topics`` (``service/ops/topics.py``) against the real broker: the three topics
created with the partitions asked for, then found present (idempotent)."""

from __future__ import annotations

import uuid

from confluent_kafka.admin import AdminClient

from tests.support import stack
from tests.support.workers import payauth


def test_topics_creates_the_three_then_finds_them_present(live_stack: None) -> None:
    suffix = uuid.uuid4().hex[:8]
    world = stack.Env(database="unused", input_topic=f"t.{suffix}.in",
                      output_topic=f"t.{suffix}.out", dlq_topic=f"t.{suffix}.dlq",
                      group_id=f"g-{suffix}", partitions=3)
    names = [world.input_topic, world.output_topic, world.dlq_topic]
    try:
        first = payauth(world, "topics", "--partitions", "3", "--wait", "30")
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip() == f"topics: created {', '.join(names)}"
        listed = AdminClient({"bootstrap.servers": stack.BOOTSTRAP}).list_topics(timeout=10)
        assert {n: len(listed.topics[n].partitions) for n in names} == dict.fromkeys(names, 3)
        again = payauth(world, "topics", "--partitions", "3")
        assert (again.returncode, again.stdout.strip()) == (0, "topics: all present")
    finally:
        stack.delete_topics(names)
