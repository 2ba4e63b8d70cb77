"""``payauth dlq redrive``: send dead-lettered messages back to the input topic after a fix.

The original key and bytes go back unchanged, with the original headers plus
``redrive.source`` (``dlq-topic/partition/offset``) and ``redrive.reason``, so the worker's
logs and the DLQ (if it fails again) tell a redriven message apart. Dry run by default.
Redriving is safe to repeat: a message that was meanwhile decided is a duplicate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from confluent_kafka import Producer

from service.adapters.kafka import client_config, producer_config, read_snapshot
from service.config import Settings


@dataclass(frozen=True)
class DeadLetter:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> str:
        for key, value in self.headers:
            if key == name:
                return value.decode(errors="replace")
        return ""


def read_dead_letters(
    settings: Settings,
    *,
    reason: str | None = None,
    from_offset: int | None = None,
    to_offset: int | None = None,
    partitions: list[int] | None = None,
) -> list[DeadLetter]:
    """The DLQ as it stands now (up to each partition's current end), filtered."""
    conf = {**client_config(settings), "group.id": f"{settings.group_id}.redrive"}
    out: list[DeadLetter] = []
    for msg in read_snapshot(conf, settings.dlq_topic, partitions=partitions,
                             from_offset=from_offset or 0):
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None:
            continue
        if to_offset is not None and offset > to_offset:
            continue
        raw = msg.headers() or []
        pairs = list(raw.items()) if isinstance(raw, dict) else raw
        headers = [(k, v if isinstance(v, bytes) else str(v or "").encode()) for k, v in pairs]
        letter = DeadLetter(partition, offset, msg.key(), msg.value(), headers)
        if reason is None or letter.header("error.reason") == reason:
            out.append(letter)
    return sorted(out, key=lambda d: (d.partition, d.offset))


def summarize(letters: list[DeadLetter], *, execute: bool) -> str:
    by_reason = Counter(letter.header("error.reason") for letter in letters)
    verb = "redriving" if execute else "would redrive (dry run; --execute to send)"
    lines = [f"dlq: {verb} {len(letters)} message(s)"]
    for reason, count in sorted(by_reason.items()):
        lines.append(f"  {reason or '(no reason)':<28}{count:>8}")
    for letter in letters[:10]:
        lines.append(
            f"  dlq {letter.partition}/{letter.offset}  from "
            f"{letter.header('source.topic')}/{letter.header('source.partition')}/"
            f"{letter.header('source.offset')}  {letter.header('error.reason')}: "
            f"{letter.header('error.detail')[:80]}"
        )
    if len(letters) > 10:
        lines.append(f"  … and {len(letters) - 10} more")
    return "\n".join(lines)


def redrive(settings: Settings, letters: list[DeadLetter]) -> int:
    producer = Producer(producer_config(settings))
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for letter in letters:
        headers: list[tuple[str, str | bytes | None]] = [
            (k, v) for k, v in letter.headers
            if not k.startswith(("error.", "source.", "redrive."))
        ]
        headers += [
            ("redrive.source", f"{settings.dlq_topic}/{letter.partition}/{letter.offset}".encode()),
            ("redrive.reason", letter.header("error.reason").encode()),
        ]
        while True:
            try:
                producer.produce(settings.input_topic, key=letter.key, value=letter.value,
                                 headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"redrive incomplete: {remaining} unsent, failures {failures[:3]}")
    return len(letters)
