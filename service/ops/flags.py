"""The operator commands' flag types (argparse ``type=``): a flag is checked before anything
connects, and a bad one is refused in one line naming it (``cli._Parser``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from service.domain.errors import DeadLetterReason


def whole(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value
    return parse


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds of 0 or more")
    return value


def shift(text: str) -> int:
    value = whole(-(2**63), "a whole number")(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 moves nothing: give -N to re-read N messages")
    return value


def partition_list(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of partition numbers (e.g. 0,3)")
    numbers = [int(p) for p in parts]
    if len(set(numbers)) != len(numbers):
        raise argparse.ArgumentTypeError(f"{text!r} names a partition twice")
    return numbers


def iso_datetime(text: str) -> datetime:
    """ISO 8601; UTC when no zone is given."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date-time (e.g. 2026-04-07T14:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def reason(text: str) -> str:
    if text not in DeadLetterReason.__members__:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dead-letter reason ({', '.join(DeadLetterReason)})")
    return text


def directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return text


offset = whole(0, "an offset (0 or more)")


def principal(text: str) -> str:
    """A Kafka principal, ``User:NAME``: anything else is refused before the cluster is
    asked."""
    kind, colon, name = text.partition(":")
    if not colon or kind != "User" or not name:
        raise argparse.ArgumentTypeError(f"a principal is User:NAME, not {text!r}")
    return text
