"""``payauth dlq redrive``: send dead-lettered messages back to the input topic after a fix.

The original key and bytes go back unchanged, with the original headers plus
``redrive.source`` (``dlq-topic/partition/offset``) and ``redrive.reason``, so the worker's
logs and the DLQ (if it fails again) tell a redriven message apart. Dry run by default.
Redriving is safe to repeat: a message that was meanwhile decided is a duplicate.

A dead letter that could not carry its original (``original.truncated``: larger than Kafka
takes) is redriven from the original on the input topic at its ``source.*`` coordinates,
after checking its ``original.sha256``; if retention deleted it, that letter is reported
and left alone. Details are shown masked, whichever version wrote them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

from confluent_kafka import Producer

from service.adapters.kafka.admin import read_one, read_snapshot
from service.adapters.kafka.config import client_config, producer_config
from service.config import Settings
from service.domain.pan import redact


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

    @property
    def truncated(self) -> bool:
        return self.header("original.truncated") == "true"


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
            f"{redact(letter.header('error.detail'))[:80]}"
            + (f"  (original {letter.header('original.size')} bytes, on the input topic)"
               if letter.truncated else "")
        )
    if len(letters) > 10:
        lines.append(f"  … and {len(letters) - 10} more")
    return "\n".join(lines)


def with_originals(settings: Settings, letters: list[DeadLetter]
                   ) -> tuple[list[DeadLetter], list[str]]:
    """Each truncated letter replaced by its original from the input topic (hash checked);
    the ones whose original is gone are left out, each with a line saying why."""
    conf = {**client_config(settings), "group.id": f"{settings.group_id}.redrive"}
    ready: list[DeadLetter] = []
    missing: list[str] = []
    for letter in letters:
        if not letter.truncated:
            ready.append(letter)
            continue
        where = (f"{letter.header('source.topic')}/{letter.header('source.partition')}/"
                 f"{letter.header('source.offset')}")
        original = read_one(conf, letter.header("source.topic"),
                            int(letter.header("source.partition")),
                            int(letter.header("source.offset")))
        value = original.value() if original is not None else None
        if original is None or value is None or hashlib.sha256(value).hexdigest() != letter.header(
                "original.sha256"):
            missing.append(f"dlq {letter.partition}/{letter.offset}: the original at {where} "
                           "is gone (retention) or differs; not redriven")
            continue
        ready.append(DeadLetter(letter.partition, letter.offset, original.key(), value,
                                letter.headers))
    return ready, missing


def redrive(settings: Settings, letters: list[DeadLetter]) -> int:
    largest = max((len(letter.value or b"") for letter in letters), default=0)
    # What was on the input topic goes back whole, however large (compressed on the wire).
    producer = Producer({**producer_config(settings), "message.max.bytes": max(
        settings.kafka_message_max_bytes, largest + 1_048_576)})
    failures: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    for letter in letters:
        headers: list[tuple[str, str | bytes | None]] = [
            (k, v) for k, v in letter.headers
            if not k.startswith(("error.", "source.", "redrive.", "original."))
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
