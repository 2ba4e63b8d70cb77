"""Decoding and validating an authorization request into exact values.

``decode_authorization(raw)`` either returns an ``Authorization`` or raises
``InvalidMessage`` with a dead-letter reason, in two steps: ``_parse`` (size, UTF-8, strict
JSON, card data) and ``_validate`` (the schema). Before it, the worker reads
``redelivery_key`` to recognise a redelivery at a fraction of the cost.

Amounts never pass through ``float``: ``json.loads`` is told to build ``Decimal``s and to
refuse ``NaN``/``Infinity`` outright (it would otherwise turn them into floats even with
``parse_float=Decimal``). A document without escapes, floats or repeated keys (nearly every
message) is read by orjson instead, which reads it exactly the same (``_read_plain``).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

import orjson
from pydantic import ValidationError

from service.domain.errors import DeadLetterReason, InvalidMessage
from service.domain.money import format_amount
from service.domain.pan import document_contains_pan, has_long_digit_run, may_contain_pan
from service.domain.schema import ENVELOPE
from service.domain.vocabulary import DEFAULT_MAX_REFUND, AuthorizationType

# Stable namespace for event ids: the same transaction_id always yields the same event_id.
EVENT_NAMESPACE = uuid.UUID("6b1f5c1e-8f4e-4e1c-9a55-3f0d2f0c9a01")

@dataclass(slots=True)  # not frozen: built per message, and frozen init costs 3x
class Authorization:
    """A validated authorization request. ``amount`` is exact and within its currency's unit;
    ``amount_text`` and ``fingerprint`` are derived once, as it is validated (``_validate``;
    the fingerprint is the redelivery key's when the amount was sent in its canonical text)."""

    transaction_id: str
    account_id: str
    amount: Decimal
    currency: str
    authorization_type: AuthorizationType
    card_number_hash: str
    merchant: str
    merchant_category: str
    message_id: str
    correlation_id: str | None
    sent_at: datetime | None
    amount_text: str  # the amount in its currency's minor unit ("125.50"): stored, published
    fingerprint: str  # ``fingerprint_of`` its key fields: what makes a retry the same request
    original_transaction_id: str | None = None  # a REVERSAL's, CLEARING's, INCREMENTAL's
    partial_ok: bool = False  # partial_approval_supported
    billing_amount_text: str | None = None  # the network's conversion, in its minor unit
    billing_currency: str | None = None
    final: bool = True  # a CLEARING's
    card_id: str | None = None  # what the card controls judge (docs/operations.md)
    merchant_country: str | None = None

    @property
    def event_id(self) -> str:
        return event_id_for(self.transaction_id)


def fingerprint_of(account_id: str, amount_text: str, currency: str, auth_type: str,
                   original: str | None = None, *, partial_ok: bool = False,
                   billing: tuple[str, str] | None = None, final: bool = True) -> str:
    """What makes two requests with one transaction_id the same request.

    Same key with another amount, currency, account, type, original, conversion, partial
    approval flag or final flag is a conflict, not a duplicate; message_id, timestamps and
    merchant text may differ between retries. A request that carries none of the optional
    fields (every PURCHASE and REFUND of earlier versions) hashes what it always did; each
    one present adds itself, tagged, so no two requests hash alike.
    """
    canonical = "\x1f".join((account_id, amount_text, currency, auth_type))
    if original is not None:
        canonical += "\x1f" + original
    if partial_ok:
        canonical += "\x1fpartial"
    if billing is not None:
        canonical += "\x1fbilling:" + billing[0] + " " + billing[1]
    if not final:
        canonical += "\x1fnot-final"
    return hashlib.sha256(canonical.encode()).hexdigest()


_NAMESPACE_BYTES = EVENT_NAMESPACE.bytes
# The variant's hex digit: its top two bits set to 10 (RFC 4122), the low two kept.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def event_id_for(transaction_id: str) -> str:
    """``str(uuid.uuid5(EVENT_NAMESPACE, transaction_id))``, spelled out on the hex digest
    (RFC 4122 §4.3: SHA-1 of namespace and name; version digit 5, the RFC's variant), a
    quarter of what the uuid module's objects cost, once per event published
    (docs/benchmark.md, "Design figures")."""
    h = hashlib.sha1(_NAMESPACE_BYTES + transaction_id.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid amount or JSON value")


# A key name an error detail may quote: it cannot hold card data (or anything but a name).
_QUOTABLE_KEY = re.compile(r"[A-Za-z_][A-Za-z_.]{0,39}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            shown = repr(key) if _QUOTABLE_KEY.fullmatch(key) else "(name not shown)"
            raise ValueError(f"duplicate key {shown}")
        result[key] = value
    return result


def _describe(exc: ValidationError) -> str:
    """First few problems as 'path: message', never echoing the input values (card data)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:3]:
        path = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{path}: {err['msg']}")
    return "; ".join(parts)


class RedeliveryKey(NamedTuple):
    transaction_id: str
    fingerprint: str  # of the key fields as sent
    message_id: str | None  # unvalidated: compared (hashed), never shown
    amount: str  # as sent: when it is the canonical text, the fingerprint is the request's
    billing_amount: str | None = None  # likewise, of a conversion


def redelivery_key(raw: bytes | None, *, max_bytes: int = 65_536) -> RedeliveryKey | None:
    """(transaction_id, fingerprint of the key fields as sent, message_id, amount as sent,
    billing amount as sent), read cheaply, for a message that the strict parser (``_parse``)
    would accept and read the same way; None whenever in doubt (the message then takes the
    full path). Never raises: whatever the bytes, the worst answer is None.

    This is what lets a replay skip the strict parser and the schema check: a fingerprint
    read here can only equal one stored for a decided transaction when the key fields are
    exactly those of that validated request ("12.34", not "12.340"). The strict parser's
    refusals are kept: orjson refuses invalid UTF-8, a byte order mark, ``NaN``, control
    characters; a text with a backslash (an escape could spell a digit or a quote) is left
    to the full path, and so is a card number anywhere the strict parser would find one (a
    document with a digit run or non-ASCII text is scanned as the strict parser scans it);
    and a repeated key, which orjson would keep
    once, shows as missing quotes: with no backslash, every quote in the text delimits a
    string, and orjson writes two per string it kept.
    """
    if raw is None or len(raw) > max_bytes or b"\\" in raw:
        return None
    try:
        document = orjson.loads(raw)
        # The cheap look first (C speed): only a digit run or a non-ASCII byte needs the
        # document scan (exact: numbers, any script; the network's identifiers exempt, so
        # that numeric transaction ids keep the fast path).
        if (not raw.isascii() or has_long_digit_run(raw)) and document_contains_pan(document):
            return None
        body = document.get("body") if type(document) is dict else None
        if type(body) is not dict:
            return None
        txn_id, account, amount, currency, auth_type = (
            body.get("transaction_id"), body.get("account_id"), body.get("amount"),
            body.get("currency"), body.get("authorization_type"))
        original = body.get("original_transaction_id")
        if not (type(txn_id) is str and type(account) is str and type(amount) is str
                and type(currency) is str and type(auth_type) is str
                and (original is None or type(original) is str)):
            return None
        # The optional key fields as the strict path reads them once validated: absent, or
        # of their one type (a null or another type: the full path words it).
        partial_ok = body.get("partial_approval_supported", False)
        final = body.get("final", True)
        billing_amount = body.get("billing_amount")
        billing_currency = body.get("billing_currency")
        if not (type(partial_ok) is bool and type(final) is bool
                and ("billing_amount" in body) is (type(billing_amount) is str)
                and ("billing_currency" in body) is (type(billing_currency) is str)):
            return None
        # orjson writes back at most 254 levels of nesting: deeper is for the full path too.
        if orjson.dumps(document).count(b'"') != raw.count(b'"'):
            return None  # a key was repeated
    except (ValueError, TypeError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        return None
    headers = document.get("headers")
    message_id = headers.get("message_id") if type(headers) is dict else None
    billing = None if billing_amount is None or billing_currency is None \
        else (billing_amount, billing_currency)
    return RedeliveryKey(txn_id, fingerprint_of(account, amount, currency, auth_type, original,
                                                partial_ok=partial_ok, billing=billing,
                                                final=final),
                         message_id if type(message_id) is str else None, amount,
                         billing_amount if billing is not None else None)


def _read_plain(raw: bytes) -> Any:
    """The document, read by orjson (under half the stdlib's cost), when that reading is
    exactly the strict one below; None whenever it might not be (the strict reading decides,
    and words any refusal). Exactly: orjson refuses what the strict reading refuses (invalid
    UTF-8, a byte order mark, NaN/Infinity, control characters in strings, trailing text);
    no backslash, so no escape to read differently; no float in what it read (a fraction,
    an exponent or an integer past 64 bits, which the strict reading keeps exact); no key
    repeated, which orjson would keep once (every string it kept is written back with two
    quotes, so a dropped key shows as missing quotes); at most 254 levels of nesting, what
    orjson writes back."""
    if b"\\" in raw:
        return None
    try:
        document = orjson.loads(raw)
        if orjson.dumps(document).count(b'"') != raw.count(b'"'):
            return None
    except (ValueError, TypeError):  # JSONDecodeError, too deep to write back
        return None
    return None if _holds_a_float(document) else document


def _holds_a_float(document: Any) -> bool:
    """Whether orjson read a number as a float anywhere in the document (iterative: no
    nesting depth can exhaust the interpreter's stack). Only containers go on the stack:
    a message is mostly strings, each looked at once (half the cost of stacking them)."""
    kind = type(document)
    if kind is float:
        return True
    if kind is not dict and kind is not list:
        return False
    stack = [document]
    while stack:
        item = stack.pop()
        for value in item.values() if type(item) is dict else item:
            kind = type(value)
            if kind is str:
                continue
            if kind is float:
                return True
            if kind is dict or kind is list:
                stack.append(value)
    return False


def _parse(raw: bytes | None, *, max_bytes: int = 65_536, keyed: bool = False
           ) -> dict[str, Any]:
    """Size, encoding, JSON and card-data checks; raises ``InvalidMessage``. ``keyed``: these
    bytes got a ``redelivery_key``, so they passed orjson, the repeated-key check and a
    card-data scan that runs whenever this one would: read without a float, the document
    is the strict one and clean. (Read again, not kept from the key: a batch's documents
    kept across the cache lookup slow a replay of duplicates more than they spare new
    requests; docs/benchmark.md, "Design figures".)"""
    if raw is None:
        raise InvalidMessage(DeadLetterReason.INVALID_JSON, "empty message (null value)")
    if len(raw) > max_bytes:
        raise InvalidMessage(
            DeadLetterReason.TOO_LARGE, f"{len(raw)} bytes exceeds the limit of {max_bytes}"
        )
    if keyed:
        read = orjson.loads(raw)
        if not _holds_a_float(read):
            return read  # type: ignore[no-any-return]
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(
            DeadLetterReason.INVALID_ENCODING, f"not UTF-8 at byte {exc.start}"
        ) from None
    exponents: list[str] = []  # numbers written with an exponent: no digit run in the text

    def exact_number(literal: str) -> Decimal:
        if "e" in literal or "E" in literal:
            exponents.append(literal)
        return Decimal(literal)

    document = _read_plain(raw)
    if document is None:
        try:
            document = json.loads(
                text,
                parse_float=exact_number,
                parse_constant=_reject_constant,
                object_pairs_hook=_no_duplicate_keys,
            )
        except (ValueError, RecursionError) as exc:
            detail = str(exc).splitlines()[0][:200] if isinstance(exc, ValueError) \
                else "too deep"
            raise InvalidMessage(DeadLetterReason.INVALID_JSON, detail) from None
    if (exponents or may_contain_pan(text)) and document_contains_pan(document):
        # Checked before the schema so that no error detail can ever quote the number.
        raise InvalidMessage(
            DeadLetterReason.CARD_DATA_PRESENT,
            "the message carries what looks like a raw card number (PAN); only hashes allowed",
        )
    if not isinstance(document, dict):
        raise InvalidMessage(DeadLetterReason.SCHEMA_VIOLATION, "message must be a JSON object")
    return document


def decode_authorization(raw: bytes | None, *, max_bytes: int = 65_536,
                         max_refund: Decimal = DEFAULT_MAX_REFUND,
                         key: RedeliveryKey | None = None) -> Authorization:
    """The one place that decides whether a message is an authorization request, exactly;
    raises ``InvalidMessage`` with the dead-letter reason otherwise. ``key``: what
    ``redelivery_key`` gave for these same bytes, if it was called (checks it made are not
    made again, nor its fingerprint when the amount was sent in its canonical text)."""
    auth = _validate(_parse(raw, max_bytes=max_bytes, keyed=key is not None), key)
    if auth.authorization_type is AuthorizationType.REFUND and auth.amount > max_refund:
        # Credit from nothing: a refund this large waits for a person (redrive after a check).
        raise InvalidMessage(
            DeadLetterReason.LIMIT_EXCEEDED,
            f"REFUND amount above PAYAUTH_MAX_REFUND_AMOUNT ({max_refund})",
        )
    return auth


def _validate(document: dict[str, Any], key: RedeliveryKey | None) -> Authorization:
    """The schema (``schema.ENVELOPE``) and the amount rules; raises ``InvalidMessage``
    (SCHEMA_VIOLATION). ``key``: the redelivery key of the same bytes, if any."""
    try:
        envelope = ENVELOPE.validate_python(document)
    except ValidationError as exc:
        raise InvalidMessage(DeadLetterReason.SCHEMA_VIOLATION, _describe(exc)) from None
    body, headers = envelope["body"], envelope["headers"]
    account, currency, auth_type = body["account_id"], body["currency"], body["authorization_type"]
    original = body.get("original_transaction_id")
    amount_text = format_amount(body["amount"], currency)
    partial_ok = bool(body.get("partial_approval_supported"))
    final = body.get("final") is not False
    billing_currency, billing_amount = body.get("billing_currency"), body.get("billing_amount")
    billing_text = None if billing_currency is None or billing_amount is None else \
        format_amount(billing_amount, billing_currency)
    if key is not None and key.amount == amount_text and key.billing_amount == billing_text:
        # The key hashed these very key fields (account, currency, type and the optional
        # ones are validated as sent, unchanged; the amounts were sent in their canonical
        # text): the request's fingerprint is the key's, not hashed again.
        fingerprint = key.fingerprint
    else:
        fingerprint = fingerprint_of(
            account, amount_text, currency, auth_type, original, partial_ok=partial_ok,
            billing=None if billing_text is None or billing_currency is None
            else (billing_text, billing_currency), final=final)
    return Authorization(
        transaction_id=body["transaction_id"],
        account_id=account,
        amount=body["amount"],
        currency=currency,
        authorization_type=auth_type,
        card_number_hash=body["card_number_hash"],
        merchant=body["merchant"],
        merchant_category=body["merchant_category"],
        message_id=headers["message_id"],
        correlation_id=headers.get("correlation_id"),
        sent_at=headers.get("timestamp"),
        amount_text=amount_text,
        fingerprint=fingerprint,
        original_transaction_id=original,
        partial_ok=partial_ok,
        billing_amount_text=billing_text,
        billing_currency=billing_currency,
        final=final,
        card_id=body.get("card_id"),
        merchant_country=body.get("merchant_country"),
    )
