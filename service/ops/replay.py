"""``payauth replay``: rewind the group's committed offsets after a bug fix, safely.

A dry run by default: the plan per partition (current committed offset, target offset,
messages to re-read, timestamp of the first message re-read). ``--execute`` applies it and
reads the committed offsets back. Refuses:

- while the group has active members (their next commit would overwrite the rewind, and
  Kafka would anyway reject it as UNKNOWN_MEMBER_ID partition by partition);
- a target whose first re-read message is older than the dedup retention window, unless
  ``--force``: dedup records older than that may be purged, and a declined transaction
  would then be decided again.

Already-decided transactions that are re-read are discarded as duplicates (no money moves);
messages dead-lettered or never processed are processed now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from service.adapters.kafka.admin import committed_offsets
from service.adapters.kafka.config import client_config
from service.config import Settings


class ReplayRefused(Exception):
    """The replay would be unsafe or is impossible; the message says why, in one sentence."""


@dataclass(frozen=True)
class PartitionPlan:
    partition: int
    current: int | None  # committed offset, None when the group never committed
    target: int
    low: int
    high: int
    first_timestamp: datetime | None  # of the first message re-read

    @property
    def to_reread(self) -> int:
        start = self.current if self.current is not None else self.low
        return max(0, start - self.target)


def active_members(settings: Settings) -> list[str]:
    """Hosts (and instance ids) of the group's current members."""
    admin = AdminClient(client_config(settings))
    future = admin.describe_consumer_groups([settings.group_id], request_timeout=15)[
        settings.group_id
    ]
    try:
        description = future.result()
    except KafkaException:
        return []  # no such group yet: nobody is consuming
    return [
        f"{m.host.lstrip('/')} ({m.group_instance_id or m.client_id})"
        for m in description.members
    ]


def build_plan(
    settings: Settings,
    *,
    to_datetime: datetime | None = None,
    to_earliest: bool = False,
    shift_by: int | None = None,
    from_offset: int | None = None,
    partitions: list[int] | None = None,
) -> list[PartitionPlan]:
    consumer = Consumer({**client_config(settings), "group.id": settings.group_id,
                         "enable.auto.commit": False})
    try:
        topic = settings.input_topic
        wanted = partitions_of(consumer, topic, partitions)
        tps = [TopicPartition(topic, p) for p in wanted]
        committed = committed_offsets(consumer, tps)
        watermarks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                      for p in wanted}
        if to_datetime is not None:
            stamp = int(to_datetime.timestamp() * 1000)
            found = consumer.offsets_for_times([TopicPartition(topic, p, stamp) for p in wanted],
                                               timeout=15)
            # -1: no message at or after that time; the target is the end of the partition.
            targets = {tp.partition: tp.offset if tp.offset >= 0 else watermarks[tp.partition][1]
                       for tp in found}
        elif to_earliest:
            targets = {p: watermarks[p][0] for p in wanted}
        elif shift_by is not None:
            targets = {}
            for p in wanted:
                start = committed[p] if committed[p] >= 0 else watermarks[p][0]
                targets[p] = min(max(start + shift_by, watermarks[p][0]), watermarks[p][1])
        elif from_offset is not None:
            targets = {p: from_offset for p in wanted}  # within each partition, below
        else:
            raise ReplayRefused("say where to: --to-datetime, --to-earliest, --shift-by -N or "
                                "--from-offset")
        plans = []
        for p in wanted:
            low, high = watermarks[p]
            target = min(max(targets[p], low), high)
            plans.append(PartitionPlan(
                partition=p,
                current=committed[p] if committed[p] >= 0 else None,
                target=target,
                low=low,
                high=high,
                first_timestamp=_timestamp_at(settings, p, target, high),
            ))
        return plans
    finally:
        consumer.close()


def partitions_of(consumer: Consumer, topic: str, partitions: list[int] | None) -> list[int]:
    """The partitions asked for (all when None), each checked to exist."""
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise ReplayRefused(f"topic {topic} does not exist")
    wanted = sorted(metadata.partitions) if partitions is None else sorted(partitions)
    unknown = set(wanted) - set(metadata.partitions)
    if unknown:
        raise ReplayRefused(f"topic {topic} has no partition {sorted(unknown)}")
    return wanted


def _timestamp_at(settings: Settings, partition: int, offset: int, high: int) -> datetime | None:
    if offset >= high:
        return None
    reader = Consumer({**client_config(settings), "group.id": f"{settings.group_id}.replay-peek",
                       "enable.auto.commit": False})
    try:
        reader.assign([TopicPartition(settings.input_topic, partition, offset)])
        for _ in range(20):
            msg = reader.poll(0.5)
            if msg is not None and msg.error() is None:
                _, millis = msg.timestamp()
                return datetime.fromtimestamp(millis / 1000, UTC)
        return None
    finally:
        reader.close()


def check_window(plans: list[PartitionPlan], retention_hours: float, *, now: datetime
                 ) -> None:
    horizon = now - timedelta(hours=retention_hours)
    too_old = [p for p in plans if p.to_reread and p.first_timestamp is not None
               and p.first_timestamp < horizon]
    if too_old:
        oldest = min(p.first_timestamp for p in too_old if p.first_timestamp is not None)
        raise ReplayRefused(
            f"refusing: partition(s) {', '.join(str(p.partition) for p in too_old)} would re-read "
            f"messages from {oldest.isoformat(timespec='seconds')}, older than the dedup "
            f"retention window of {retention_hours:g} h (PAYAUTH_DEDUP_RETENTION_HOURS); "
            f"pass --force if you accept that purged transactions are decided again"
        )


def render(plans: list[PartitionPlan], title: str) -> str:
    lines = [title, f"{'partition':>9}  {'current':>10}  {'target':>10}  {'to re-read':>10}  "
                    f"first message re-read at"]
    for p in plans:
        first = p.first_timestamp.isoformat(timespec="seconds") if p.first_timestamp else "-"
        current = str(p.current) if p.current is not None else "none"
        lines.append(f"{p.partition:>9}  {current:>10}  {p.target:>10}  {p.to_reread:>10}  {first}")
    lines.append(f"{'total':>9}  {'':>10}  {'':>10}  {sum(p.to_reread for p in plans):>10}")
    return "\n".join(lines)


def execute(settings: Settings, plans: list[PartitionPlan]) -> dict[int, int]:
    """Alter the committed offsets; check every partition's result; return what is committed."""
    admin = AdminClient(client_config(settings))
    request = ConsumerGroupTopicPartitions(
        settings.group_id,
        [TopicPartition(settings.input_topic, p.partition, p.target) for p in plans],
    )
    future = admin.alter_consumer_group_offsets([request], request_timeout=30)[settings.group_id]
    result = future.result()
    # The future resolves even when the broker refused: the errors are per partition.
    failed = [(tp.partition, str(tp.error)) for tp in result.topic_partitions if tp.error]
    if failed:
        raise ReplayRefused(f"the broker refused the new offsets: {failed}")
    consumer = Consumer({**client_config(settings), "group.id": settings.group_id,
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(settings.input_topic, p.partition) for p in plans]
        return committed_offsets(consumer, tps)
    finally:
        consumer.close()


async def write_marks(dsn: str, settings: Settings, plans: list[PartitionPlan]) -> int:
    """Note, per partition rewound, the committed offset the replay started from: the
    workers count a duplicate below it as cause ``replay``. Returns the marks written."""
    rows = [(settings.group_id, settings.input_topic, p.partition, p.current)
            for p in plans if p.current is not None and p.current > p.target]
    if not rows:
        return 0
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.executemany(
            """INSERT INTO replay_marks (group_id, topic, partition, before_offset, executed_at)
               VALUES ($1, $2, $3, $4, now())
               ON CONFLICT (group_id, topic, partition)
               DO UPDATE SET before_offset = EXCLUDED.before_offset, executed_at = now()""",
            rows)
    finally:
        await conn.close()
    return len(rows)
