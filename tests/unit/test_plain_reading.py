"""The fast reading of a message (orjson: ``messages._read_plain``, or after the checks
``redelivery_key`` made) never decides otherwise than the strict one: over thousands
of seeded mutations of good messages (quotes, escapes, numbers with fractions and exponents,
64-bit overflows, repeated keys, card numbers, nesting, bytes that are not UTF-8),
``decode_authorization`` gives the same authorization (and fingerprint), or refuses with the
same reason and detail, either fast way and the strict way."""

from __future__ import annotations

import random
from typing import Any

import pytest

from service.domain import messages
from service.domain.errors import DeadLetterReason, InvalidMessage
from tests.support.factory import auth_message, encode

PIECES = [b'"', b"\\", b".", b"e", b"E", b"1", b"0", b"-", b"+", b"{", b"}", b"[", b"]", b",",
          b":", b" ", b"\xc3\xa9", b"\xff", b"\x01", b"NaN", b"4111111111111111",
          b"4.111111111111111E15", b"123456789012345678901234567890", b"\\u0034",
          b'"amount": 10.5', b'"currency": "EUR"', b'"transaction_id": "X"', b"[[[[", b"]]]]",
          b"null", b"true", b"\xef\xbb\xbf", b" 4111111111111111 ", b" 4111-1111-1111-1111 ",
          b'"pan": 4111111111111111, ',
          " ".join(["", "".join(chr(0xFF10 + int(d)) for d in "4111111111111111"), ""]).encode()]


def _mutants(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    bases = [encode(auth_message(f"T-{i}", amount=amount))  # type: ignore[arg-type]
             for i, amount in enumerate(["10.50", "1", "0.01", "999.99"])]
    bases += [encode(auth_message("T-R", amount="5.00", authorization_type="REVERSAL",
                                  original_transaction_id="T-0")),
              encode(auth_message("T-C", amount="5.00", authorization_type="CLEARING",
                                  original_transaction_id=None)),
              # the optional key fields: a split clearing, a conversion, a partial approval
              encode(auth_message("T-F", amount="5.00", authorization_type="CLEARING",
                                  original_transaction_id="T-0", final=False)),
              encode(auth_message("T-B", amount="1250", currency="JPY",
                                  billing_amount="7.50", billing_currency="EUR")),
              encode(auth_message("T-P", amount="5.00", partial_approval_supported=True))]
    out = []
    for _ in range(count):
        raw = bytearray(rng.choice(bases))
        for _ in range(rng.choice((1, 1, 2, 3))):
            at = rng.randrange(len(raw) + 1)
            piece = rng.choice(PIECES)
            if rng.random() < 0.5:
                raw[at:at] = piece
            else:
                raw[at:at + len(piece)] = piece
        out.append(bytes(raw))
    # whole documents the mutations rarely reach
    out += [b'{"headers": {"message_id": "m"}, "body": {"x": 1e400}}',
            b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}",
            b'{"a": 18446744073709551615, "b": 18446744073709551616, "c": -9223372036854775809}',
            b'{"a": "x", "a": "y"}', b"[1, 2]", b'"text"', b"{}", b" {} "]
    return out


def _outcome(raw: bytes, key: messages.RedeliveryKey | None = None) -> tuple[str, Any]:
    try:
        auth = messages.decode_authorization(raw, key=key)
    except InvalidMessage as exc:
        return "refused", (exc.reason, exc.detail)
    # the fingerprint too: a keyed decoding takes the key's when the amount was canonical
    return "decided", (repr(auth), auth.fingerprint)


def test_the_fast_reading_never_decides_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _mutants(4000, seed=13)
    plain = messages._read_plain
    taken = sum(plain(raw) is not None for raw in corpus)
    fast = [_outcome(raw) for raw in corpus]
    keys = [messages.redelivery_key(raw) for raw in corpus]  # the worker's path: key first
    keyed = [_outcome(raw, key) for raw, key in zip(corpus, keys, strict=True)]
    monkeypatch.setattr(messages, "_read_plain", lambda _raw: None)
    strict = [_outcome(raw) for raw in corpus]
    for raw, a, b, c in zip(corpus, fast, keyed, strict, strict=True):
        assert a == c and b == c, raw
    # not a vacuous comparison: both readings ran on many messages, accepted and refused
    assert taken > 1000
    assert sum(key is not None for key in keys) > 500
    assert sum(kind == "decided" for kind, _ in strict) > 500
    assert sum(kind == "refused" for kind, _ in strict) > 1000


@pytest.mark.parametrize("raw", [
    b'{"a": 1.5}', b'{"a": 1e3}', b'{"a": 123456789012345678901234567890}',  # floats
    b'{"a": "\\u0034"}',  # an escape
    b'{"a": 1, "a": 2}',  # a repeated key
    b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}",  # deeper than orjson writes back
])
def test_what_orjson_would_read_otherwise_is_left_to_the_strict_reading(raw: bytes) -> None:
    assert messages._read_plain(raw) is None


@pytest.mark.parametrize(("document", "holds"), [
    (1.5, True), ({"a": "x", "b": [1, {"c": [None, True, 2.5]}]}, True),
    ([[[[{"d": 1e300}]]]], True), ({"a": "x", "b": [1, {"c": [None, True, 2]}]}, False),
    ("text", False), (7, False), (None, False), ({}, False), ([], False),
])
def test_a_float_is_found_at_any_depth(document: Any, holds: bool) -> None:
    assert messages._holds_a_float(document) is holds


@pytest.mark.parametrize(("amount", "canonical"), [("10.50", True), ("10.5", False),
                                                   ("7", False), ("0.01", True)])
def test_a_keyed_decoding_has_the_fingerprint_of_what_it_validated(
        amount: str, canonical: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = encode(auth_message("T", amount=amount))
    key = messages.redelivery_key(raw)
    assert key is not None
    hashed = []
    fingerprint_of = messages.fingerprint_of
    monkeypatch.setattr(messages, "fingerprint_of",
                        lambda *fields, **options: hashed.append(fields)
                        or fingerprint_of(*fields, **options))
    auth = messages.decode_authorization(raw, key=key)
    assert auth.fingerprint == fingerprint_of(
        auth.account_id, auth.amount_text, auth.currency, auth.authorization_type)
    assert (not hashed) is canonical  # the key's hash taken as it is; sent "10.5": hashed


def test_a_plain_document_is_read_fast() -> None:
    raw = encode(auth_message("T", amount="10.50"))
    assert messages._read_plain(raw) == messages._parse(raw)


@pytest.mark.parametrize("extra", [
    b'"note":411111111117E4',  # a Luhn-valid card number only the exponent spells
    b'"note": 1.7e9',
    b'"note": 1.5, "other": [2.5e-3]',
])
def test_a_float_beside_the_key_fields_takes_the_strict_reading(extra: bytes) -> None:
    raw = encode(auth_message("T", amount="10.50")).replace(b'"merchant":',
                                                           extra + b', "merchant":')
    key = messages.redelivery_key(raw)
    assert key is not None  # the key fields are fine: the worker decodes after a key
    assert _outcome(raw, key) == _outcome(raw)
    if b"E4" in extra:
        assert _outcome(raw)[1][0] is DeadLetterReason.CARD_DATA_PRESENT
