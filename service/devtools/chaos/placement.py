"""Offsets for messages the broker acknowledged without one.

An idempotent producer that retries a batch the broker had already written (its first
answer lost: a broker paused, a connection cut) gets DUPLICATE_SEQUENCE_NUMBER back, and
librdkafka then reports the messages delivered with no offset. The ground-truth log needs
each message's offset (the checker orders an account's messages by it, the gaps measure
from it), so the load generator keeps those aside and, once the load is over, finds them in
their partition by their bytes (``place``). The same bytes can sit at several offsets (a
duplicate sent as the very same message): the unplaced copies then take the offsets no
logged copy has, in the order they were sent, which for one idempotent producer is the
order of their offsets.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

Unplaced = tuple[dict[str, Any], bytes]  # (log line without its offset, the message's bytes)


def assign(unplaced: list[Unplaced], found: dict[bytes, list[int]],
           logged: set[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The unplaced lines of one partition with their offsets, and those without any:
    ``found`` the offsets each message's bytes sit at, ``logged`` the offsets other log
    lines already name."""
    placed, missing = [], []
    by_bytes: dict[bytes, list[dict[str, Any]]] = defaultdict(list)
    for line, raw in unplaced:
        by_bytes[raw].append(line)
    for raw, lines in by_bytes.items():
        free = sorted(o for o in found.get(raw, []) if o not in logged)
        lines.sort(key=lambda line: line["seq"])
        for line, offset in zip(lines, free, strict=False):
            placed.append({**line, "offset": offset})
        missing.extend(lines[len(free):])
    return placed, missing


def read_offsets(conf: dict[str, Any], topic: str, partition: int,
                 wanted: Iterable[bytes]) -> dict[bytes, list[int]]:
    """Every offset of ``partition`` whose message has one of the ``wanted`` bytes."""
    wanted = set(wanted)
    found: dict[bytes, list[int]] = defaultdict(list)
    consumer = Consumer({**conf, "group.id": "chaos-placement", "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                   timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        position, deadline = low, time.monotonic() + 120
        while position < high and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=5):
                offset, value = msg.offset(), msg.value()
                if msg.error() or offset is None or value is None:
                    continue
                position = max(position, offset + 1)
                if value in wanted:
                    found[value].append(offset)
    finally:
        consumer.close()
    return found


def logged_offsets(log_path: Path, partitions: set[int]) -> dict[int, set[int]]:
    """The offsets the log's lines name, in each of ``partitions``."""
    out: dict[int, set[int]] = defaultdict(set)
    with log_path.open() as log:
        for text in log:
            line = json.loads(text)
            if line["partition"] in partitions:
                out[line["partition"]].add(line["offset"])
    return out


def place(conf: dict[str, Any], topic: str, unplaced: list[Unplaced],
          log_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``assign`` for each partition the unplaced lines name, reading it once, against the
    offsets the log at ``log_path`` (flushed) already names."""
    placed, missing = [], []
    by_partition: dict[int, list[Unplaced]] = defaultdict(list)
    for line, raw in unplaced:
        by_partition[line["partition"]].append((line, raw))
    logged = logged_offsets(log_path, set(by_partition)) if by_partition else {}
    for partition, lines in by_partition.items():
        found = read_offsets(conf, topic, partition, (raw for _, raw in lines))
        ok, lost = assign(lines, found, logged.get(partition, set()))
        placed += ok
        missing += lost
    return placed, missing
