"""Detect raw card numbers (PANs) so that a message carrying one is refused, not stored.

A PAN here is 13 to 19 digits, possibly grouped by spaces or dashes, standing on its own (a
digit run inside a longer token, such as a hex digest, is not one), whose first digit is a
payment-card industry identifier (ISO/IEC 7812: 2 to 6, covering Mastercard, Amex, JCB,
Diners, Visa, Discover, UnionPay, Maestro), and that passes the Luhn check.

The identifiers the network assigns (message_id, correlation_id, transaction_id,
account_id) are not scanned: they are opaque ids constrained to 64 printable characters,
and a numeric id would otherwise be refused one time in twenty. Card data leaks through the
other fields (free text, a hash that is not a hash, a field the gateway should not send),
and every one of those is scanned, extra fields included.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Runs of 13+ digits/spaces/dashes that start and end with a digit: a linear scan that
# rules out almost every message before the (backtracking) candidate pattern runs.
_RUN = re.compile(r"[0-9][0-9 -]{11,}[0-9]")
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
        if 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_valid(digits):
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


_IDENTIFIERS = {
    "headers": {"message_id", "correlation_id", "timestamp"},
    "body": {"transaction_id", "account_id", "amount", "currency"},
}


# Every byte that may be part of a candidate (ASCII digit, space, dash) becomes "#", any
# other byte ".": a candidate needs 13 such bytes in a row, which ``bytes.find`` rules out
# at C speed for nearly every message (a hex digest rarely has 13 digits in a row).
_RUN_BYTES = bytes(35 if chr(b) in "0123456789 -" else 46 for b in range(256))
_THIRTEEN = b"#" * 13


def may_contain_pan(text: str) -> bool:
    """A cheap first look at the raw text: no 13-digit candidate at all means no PAN.

    JSON may spell a digit as an escape (``\\u0034``), which only the decoded document
    shows; a text with escapes is therefore always looked at closely.
    """
    if "\\u" in text:
        return True
    if not has_long_digit_run(text.encode("utf-8", "surrogatepass")):
        return False
    return any(_CANDIDATE.search(run.group()) for run in _RUN.finditer(text))


def has_long_digit_run(raw: bytes) -> bool:
    """13 or more digits, spaces or dashes in a row: where a card number could hide."""
    return _THIRTEEN in raw.translate(_RUN_BYTES)


def document_contains_pan(document: object) -> bool:
    """True when a key, string or integer of a decoded message, identifiers aside, is a PAN."""
    if not isinstance(document, dict):
        return any(contains_pan(text) for text in _strings(document))
    for key, value in document.items():
        if contains_pan(str(key)):
            return True
        skip = _IDENTIFIERS.get(key, set())
        if isinstance(value, dict) and skip:
            parts: object = {k: v for k, v in value.items() if k not in skip}
        else:
            parts = value
        if any(contains_pan(text) for text in _strings(parts)):
            return True
    return False
