"""Detect raw card numbers (PANs) so that a message carrying one is refused, not stored, and
mask them in anything the service writes.

What a PAN looks like here, after normalisation: 13 to 19 digits, possibly grouped by single
spaces, dashes or dots, standing on its own (a digit run inside a longer token, such as a
hex digest, is not one), whose first digit is a payment-card industry identifier (ISO/IEC
7812: 2 to 6, covering Mastercard, Amex, JCB, Diners, Visa, Discover, UnionPay, Maestro),
and that passes the Luhn check. Normalisation (``normalize``) reads digits of any script as
ASCII digits (fullwidth digits, Arabic-Indic digits), any Unicode space as a space,
any dash as ``-`` and any full stop as ``.``. A number is scanned as well as a string: its
integral part (``4111111111111111.0`` and ``4.111111111111111E+15`` are the same card).

The identifiers the network assigns (message_id, correlation_id, transaction_id,
account_id) are not scanned: they are opaque ids constrained to 64 printable characters,
and a numeric id would otherwise be refused one time in twenty. Card data leaks through the
other fields (free text, a hash that is not a hash, a currency that is not a currency, a
field the gateway should not send), and every one of those is scanned, extra fields
included, at any depth.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from decimal import Decimal
from functools import lru_cache

# A candidate: 13 to 19 digits, single separators between them, not inside a longer token.
_CANDIDATE = re.compile(r"(?<![0-9A-Za-z])(?:[0-9][ .-]?){12,18}[0-9](?![0-9A-Za-z])")
_SEPARATORS = re.compile(r"[ .-]")
# Masking is stricter than detection: any 13+ digit run, Luhn or not, inside a token or not.
_LONG_DIGIT_RUN = re.compile(r"[0-9](?:[ .-]?[0-9]){12,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@lru_cache(maxsize=4096)
def _ascii_form(char: str) -> str:
    digit = unicodedata.decimal(char, None)
    if digit is not None:
        return str(digit)
    category = unicodedata.category(char)
    if category == "Zs":
        return " "
    if category == "Pd" or char == "\u2212":  # dashes, and the minus sign
        return "-"
    folded = unicodedata.normalize("NFKC", char)
    return folded if folded in (".", "-", " ") else char


def normalize(text: str) -> str:
    """Digits of any script as ASCII digits, Unicode spaces, dashes and full stops as their
    ASCII forms; ASCII text is returned as it is (the common case costs one check)."""
    if text.isascii():
        return text
    return _NON_ASCII.sub(lambda m: _ascii_form(m.group()), text)


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
    # A candidate spans 13 characters or more (normalising keeps the length), all of them
    # digits or separators: two cheap looks rule out nearly every key and value of a message.
    if len(text) < 13:
        return False
    normal = normalize(text)
    if not has_long_digit_run(normal.encode("ascii", "replace")):
        return False
    for match in _CANDIDATE.finditer(normal):
        digits = _SEPARATORS.sub("", match.group())
        if 13 <= len(digits) <= 19 and digits[0] in "23456" and luhn_valid(digits):
            return True
    return False


def redact(text: str) -> str:
    """``text`` with every run of 13 or more digits (any script, grouped or not) masked to
    its last four digits: for what the service writes (dead-letter details, logs, command
    output), where even a digit run that fails the PAN test is not worth the risk."""
    normal = normalize(text)
    if not _LONG_DIGIT_RUN.search(normal):
        return text
    return _LONG_DIGIT_RUN.sub(lambda m: "[digits masked …" + _SEPARATORS.sub(
        "", m.group())[-4:] + "]", normal)


def number_texts(value: int | Decimal) -> Iterator[str]:
    """How a JSON number could spell a card number: its digits, and its integral part."""
    if isinstance(value, int):
        yield str(value)
        return
    if not value.is_finite():
        return
    yield format(value, "f") if abs(value.adjusted()) < 40 else str(value)
    if abs(value) >= 10**12 and value.adjusted() < 20:
        yield str(int(value))


# Every byte that may be part of a candidate (ASCII digit, space, dash, dot) becomes "#", any
# other byte ".": a candidate needs 13 such bytes in a row, which ``bytes.find`` rules out
# at C speed for nearly every message (a hex digest rarely has 13 digits in a row).
_RUN_BYTES = bytes(35 if chr(b) in "0123456789 -." else 46 for b in range(256))
_THIRTEEN = b"#" * 13


def has_long_digit_run(raw: bytes) -> bool:
    """13 or more ASCII digits, spaces, dashes or dots in a row: where a card number could
    hide in ASCII text (``may_contain_pan`` also looks at non-ASCII text and escapes)."""
    return _THIRTEEN in raw.translate(_RUN_BYTES)


def may_contain_pan(text: str) -> bool:
    """A cheap first look at the raw text: no candidate at all means no PAN.

    JSON may spell a digit as an escape (``\\u0034``), which only the decoded document
    shows: a text with escapes is always looked at closely. Non-ASCII text is normalised
    first (fullwidth or other scripts' digits). A number written with an exponent and a
    short mantissa (``411111111111E4``) shows no digit run either: the strict parser flags
    every such number as it reads it (``messages._parse``).
    """
    if "\\u" in text:
        return True
    normal = normalize(text)
    if not has_long_digit_run(normal.encode("ascii", "replace")):
        return False
    return _CANDIDATE.search(normal) is not None


_IDENTIFIERS = {
    "headers": {"message_id", "correlation_id", "timestamp"},
    # original_transaction_id names a transaction_id: the same identifier, the same exemption
    # (else a reversal of a transaction whose numeric id passes Luhn would be refused).
    "body": {"transaction_id", "original_transaction_id", "account_id", "amount"},
}


def _scalars(value: object) -> Iterator[str]:
    """Every key and scalar of a decoded document, as text; iterative, so that no nesting
    depth can exhaust the interpreter's stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, (int, Decimal)):
            yield from number_texts(item)
        elif isinstance(item, float):  # never from the strict parser; scanned all the same
            yield from number_texts(Decimal(repr(item)))
        elif isinstance(item, dict):
            for key, child in item.items():
                yield str(key)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)


def document_contains_pan(document: object) -> bool:
    """True when a key or scalar of a decoded message, identifiers aside, is a PAN."""
    if not isinstance(document, dict):
        return any(contains_pan(text) for text in _scalars(document))
    for key, value in document.items():
        if contains_pan(str(key)):
            return True
        skip = _IDENTIFIERS.get(key, set())
        if isinstance(value, dict) and skip:
            parts: object = {k: v for k, v in value.items() if k not in skip}
        else:
            parts = value
        if any(contains_pan(text) for text in _scalars(parts)):
            return True
    return False
