"""Detect raw card numbers (PANs) so that a message carrying one is refused, not stored.

A PAN is 13 to 19 digits, possibly grouped by spaces or dashes, that pass the Luhn check,
standing on its own: a digit run inside a longer token (a hex digest such as the card hash,
an id like "TXN9876543210987654A") is not a card number, or every 1,000th hash would be.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_CANDIDATE = re.compile(r"(?<![0-9A-Za-z])(?:\d[ -]?){12,18}\d(?![0-9A-Za-z])")


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def contains_pan(text: str) -> bool:
    for match in _CANDIDATE.finditer(text):
        digits = re.sub(r"[ -]", "", match.group())
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            return True
    return False


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        yield str(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def document_contains_pan(document: object) -> bool:
    """True when any key, string or integer anywhere in a decoded JSON document is a PAN."""
    return any(contains_pan(text) for text in _strings(document))
