"""Validation: every kind of bad message gets its dead-letter reason, good ones exact values."""

from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest

from service.domain.errors import DeadLetterReason, InvalidMessage
from service.domain.messages import AuthorizationType, decode_authorization
from service.domain.money import fits_minor_unit, format_amount, format_stored, minor_unit, quantum
from service.domain.vocabulary import MAX_AMOUNT
from tests.support.factory import auth_message, encode

R = DeadLetterReason
PAN = "4111111111111111"  # Luhn-valid test card number


def reason_of(raw: bytes, **kwargs: int) -> DeadLetterReason:
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(raw, **kwargs)
    return info.value.reason


def with_body(**fields: object) -> bytes:
    return encode(auth_message("TXN-1", **fields))  # type: ignore[arg-type]


def test_good_message_decodes_to_exact_values() -> None:
    auth = decode_authorization(encode(auth_message(
        "TXN-VISA-8847291", account_id="ACC-44821", amount=Decimal("125.50"))))
    assert auth.transaction_id == "TXN-VISA-8847291"
    assert auth.amount == Decimal("125.50") and isinstance(auth.amount, Decimal)
    assert auth.amount_text == "125.50"
    assert auth.authorization_type is AuthorizationType.PURCHASE


def test_the_contract_example_is_accepted() -> None:
    raw = b"""{
      "headers": {"message_id": "msg-2026-04-07-x8f3a", "correlation_id": "txn-VISA-2026-8847291",
                  "timestamp": "2026-04-07T14:32:15Z", "source": "payment-network-gateway"},
      "body": {"transaction_id": "TXN-VISA-8847291", "card_number_hash": "sha256:a1b2c3...",
               "account_id": "ACC-44821", "amount": 125.50, "currency": "EUR",
               "merchant": "Amazon.es", "merchant_category": "5411",
               "authorization_type": "PURCHASE"}
    }"""
    auth = decode_authorization(raw)
    assert auth.amount == Decimal("125.50") and auth.correlation_id == "txn-VISA-2026-8847291"


@pytest.mark.parametrize("amount", ["125.50", 125, "0.01"])
def test_amount_as_json_number_or_string(amount: object) -> None:
    raw = with_body(amount=amount)
    assert decode_authorization(raw).amount == Decimal(str(amount))


@pytest.mark.parametrize(
    ("literal", "reason"),
    [
        ("NaN", R.INVALID_JSON),
        ("Infinity", R.INVALID_JSON),
        ("-Infinity", R.INVALID_JSON),
        ("1e400", R.SCHEMA_VIOLATION),  # finite as a Decimal, but beyond what we store
        ("0", R.SCHEMA_VIOLATION),
        ("0.00", R.SCHEMA_VIOLATION),
        ("-5.00", R.SCHEMA_VIOLATION),
        ("1.234", R.SCHEMA_VIOLATION),  # EUR has two decimals
        ('"NaN"', R.SCHEMA_VIOLATION),
        ('"Infinity"', R.SCHEMA_VIOLATION),
        ('"1e3"', R.SCHEMA_VIOLATION),
        ('" 12.00"', R.SCHEMA_VIOLATION),
        ("true", R.SCHEMA_VIOLATION),
        ("[1]", R.SCHEMA_VIOLATION),
        ("null", R.SCHEMA_VIOLATION),
        # A string amount is a plain decimal: no sign, no bare point, no leading zero.
        ('"+10.00"', R.SCHEMA_VIOLATION),
        ('"10."', R.SCHEMA_VIOLATION),
        ('".5"', R.SCHEMA_VIOLATION),
        ('"010.00"', R.SCHEMA_VIOLATION),
        # Exactly: never rounded to fit the currency, never sent to zero by a tiny exponent.
        ("1.0000000000000000000000000000000000001", R.SCHEMA_VIOLATION),
        ('"1.0000000000000000000000000000000000001"', R.SCHEMA_VIOLATION),
        ("1E-999999999999999999", R.SCHEMA_VIOLATION),
    ],
)
def test_bad_amounts(literal: str, reason: DeadLetterReason) -> None:
    raw = with_body(amount="PLACEHOLDER").replace(b'"PLACEHOLDER"', literal.encode())
    assert reason_of(raw) is reason


def test_decimals_follow_the_currency_minor_unit() -> None:
    assert reason_of(with_body(amount="100.5", currency="JPY")) is R.SCHEMA_VIOLATION
    assert decode_authorization(with_body(amount="100", currency="JPY")).amount_text == "100"
    assert decode_authorization(with_body(amount="1.234", currency="KWD")).amount_text == "1.234"
    # Trailing zeros are not extra precision: 125.500 EUR is 125.50 EUR.
    assert decode_authorization(with_body(amount="125.500")).amount_text == "125.50"


def decimals_of(amount: Decimal) -> int:
    """Significant decimals, counted from the digits and the exponent (no arithmetic that
    could round): 125.50 has 1, 125 has 0, 1E-999999999999999999 has that many."""
    _sign, digits, exponent = amount.as_tuple()
    assert isinstance(exponent, int)
    trailing_zeros = len(digits) - len(bytes(digits).rstrip(b"\x00"))
    if trailing_zeros == len(digits):
        return 0  # zero
    return max(0, -(exponent + trailing_zeros))


def test_the_minor_unit_check_says_what_counting_decimals_says() -> None:
    """``fits_minor_unit`` (rounding and comparing) against ``decimals_of`` (counting the
    digits), over seeded amounts up to MAX_AMOUNT: short and long coefficients, trailing
    zeros, tiny and large exponents, for currencies of 0 to 4 decimals."""
    rng = random.Random(7)
    amounts = [Decimal("1.0000000000000000000000000000000000001"), Decimal("1E-999999999"),
               Decimal("1E-999999999999999999"), Decimal("5E+2"), Decimal("125.500"),
               MAX_AMOUNT, Decimal("0.0001")]
    while len(amounts) < 20_000:
        digits = str(rng.randrange(1, 10 ** rng.randint(1, 30))) + "0" * rng.randint(0, 4)
        amount = Decimal(f"{digits}E{rng.randint(-40, 14)}")
        if amount <= MAX_AMOUNT:
            amounts.append(amount)
    verdicts = set()
    for currency in ("JPY", "EUR", "KWD", "CLF"):
        for amount in amounts:
            fits = fits_minor_unit(amount, quantum(currency))
            assert fits is (decimals_of(amount) <= minor_unit(currency)), (amount, currency)
            verdicts.add(fits)
    assert verdicts == {True, False}  # both answers were given, many times


def test_an_amount_as_postgresql_writes_it_is_formatted_as_any_other() -> None:
    """``format_stored`` (the text kept when it has the currency's decimals) against
    ``format_amount`` (read, rounded, written), over numerics as PostgreSQL writes them:
    signed, 0 to 6 decimals, for currencies of 0 to 4; both paths taken."""
    rng = random.Random(11)
    texts = ["0", "0.00", "12.34", "-12.34", "1250", "-1250", "12.3", "12.345", "7.0000",
             "999999999999999.99", "-0.5"]
    while len(texts) < 20_000:
        places = rng.randint(0, 6)
        fraction = f".{rng.randrange(10 ** places):0{places}d}" if places else ""
        texts.append(f"{rng.choice(['', '-'])}{rng.randrange(10 ** rng.randint(1, 15))}{fraction}")
    kept = set()
    for currency in ("JPY", "EUR", "KWD", "CLF"):
        for text in texts:
            formatted = format_stored(text, currency)
            assert formatted == format_amount(Decimal(text), currency), (text, currency)
            kept.add(formatted is text)
    assert kept == {True, False}


@pytest.mark.parametrize("currency", ["eur", "EURO", "XYZ", "XAU", "XXX", "", 978])
def test_unknown_lower_case_or_non_payment_currency(currency: object) -> None:
    assert reason_of(with_body(currency=currency)) is R.SCHEMA_VIOLATION


def test_python_float_is_refused_even_if_it_slips_in() -> None:
    from pydantic import ValidationError

    from service.domain.schema import BODY

    body = json.loads(with_body())["body"]
    body["amount"] = 0.1
    with pytest.raises(ValidationError, match="not a float"):
        BODY.validate_python(body)


@pytest.mark.parametrize("field", ["transaction_id", "account_id", "amount", "currency",
                                   "authorization_type", "card_number_hash", "merchant"])
def test_missing_field(field: str) -> None:
    message = auth_message("TXN-1")
    del message["body"][field]
    assert reason_of(encode(message)) is R.SCHEMA_VIOLATION


def test_missing_message_id_or_body() -> None:
    message = auth_message("TXN-1")
    del message["headers"]["message_id"]
    assert reason_of(encode(message)) is R.SCHEMA_VIOLATION
    assert reason_of(b'{"headers": {"message_id": "m"}}') is R.SCHEMA_VIOLATION


@pytest.mark.parametrize(
    "fields",
    [
        {"transaction_id": "T" * 10_000},
        {"transaction_id": "TXN\x00-1"},
        {"transaction_id": "TXN 1"},
        {"transaction_id": 12345},
        {"account_id": "ACC\n1"},
        {"merchant": "Amazon\x07"},
        {"merchant": "M" * 257},
        {"merchant_category": "54"},
        {"authorization_type": "CHARGEBACK"},
        {"authorization_type": "purchase"},
    ],
)
def test_malformed_fields(fields: dict[str, object]) -> None:
    message = auth_message("TXN-1")
    message["body"].update(fields)
    assert reason_of(encode(message)) is R.SCHEMA_VIOLATION


def test_not_json_not_utf8_duplicate_keys_not_an_object() -> None:
    assert reason_of(b"{nope") is R.INVALID_JSON
    assert reason_of(b"\xff\xfe{}") is R.INVALID_ENCODING
    assert reason_of(b'{"headers": {}, "headers": {}}') is R.INVALID_JSON
    assert reason_of(b"[1, 2]") is R.SCHEMA_VIOLATION
    assert reason_of(b"") is R.INVALID_JSON


def test_null_value_is_dead_lettered() -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(None)
    assert info.value.reason is R.INVALID_JSON


def test_too_large() -> None:
    raw = with_body(merchant="x")
    assert reason_of(raw, max_bytes=len(raw) - 1) is R.TOO_LARGE


@pytest.mark.parametrize(
    "fields",
    [{"merchant": f"Shop {PAN}"}, {"card_number": PAN}, {"merchant": "4111 1111 1111 1111"},
     {"pan": int(PAN)}],
)
def test_raw_card_number_is_refused_and_never_quoted(fields: dict[str, object]) -> None:
    message = auth_message("TXN-1")
    message["body"].update(fields)
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(encode(message))
    assert info.value.reason is R.CARD_DATA_PRESENT
    assert PAN not in str(info.value) and "1111" not in info.value.detail


def test_digit_runs_inside_tokens_are_not_card_numbers() -> None:
    message = auth_message("TXN-1")
    message["body"]["card_number_hash"] = "sha256:" + PAN + "abcdef"
    assert decode_authorization(encode(message)).transaction_id == "TXN-1"
    assert decode_authorization(with_body(merchant="4111111111111112")).merchant  # not Luhn


def test_error_detail_never_echoes_input_values() -> None:
    message = auth_message("TXN-1")
    message["body"]["merchant"] = "secret\x01value"
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(encode(message))
    assert "secret" not in info.value.detail
    assert "body.merchant" in info.value.detail


def test_fingerprint_is_the_business_payload() -> None:
    base = decode_authorization(encode(auth_message("T", amount="10.5", message_id="a")))
    retry = decode_authorization(encode(auth_message("T", amount="10.50", message_id="b",
                                                     merchant="Other text")))
    assert base.fingerprint == retry.fingerprint, "retries may differ in headers and text"
    for change in ({"amount": "10.51"}, {"currency": "USD"}, {"account_id": "ACC-2"},
                   {"authorization_type": "REFUND"}):
        other = decode_authorization(encode(auth_message("T", **{"amount": "10.50", **change})))
        assert other.fingerprint != base.fingerprint, change
    assert base.event_id == retry.event_id


def test_network_identifiers_are_not_mistaken_for_card_numbers() -> None:
    # A numeric message or transaction id that happens to pass Luhn is an id, not a PAN.
    message = auth_message("4111111111111111", message_id="4111111111111111")
    assert decode_authorization(encode(message)).transaction_id == PAN
    # So is the original a reversal names by that id.
    reversal = auth_message("R-1", authorization_type="REVERSAL", original_transaction_id=PAN)
    assert decode_authorization(encode(reversal)).original_transaction_id == PAN


def test_only_payment_card_prefixes_count() -> None:
    from service.domain.pan import contains_pan

    assert contains_pan("4111111111111111") and contains_pan("378282246310005")  # Visa, Amex
    assert contains_pan("5555555555554444") and contains_pan("6011111111111117")
    from service.domain.pan import luhn_valid

    for prefix in ("1", "7", "8", "9"):  # no payment card issuer starts with these
        number = next(n for d in "0123456789"
                      if luhn_valid(n := prefix + "11111111111111" + d))
        assert not contains_pan(number), number


def test_card_number_spelled_with_json_escapes_is_refused() -> None:
    # "\u0034\u0031…" is 4111… once decoded: the raw text shows no digit run at all.
    escaped = "".join(f"\\u{ord(c):04x}" for c in PAN)
    raw = with_body(merchant="PLACEHOLDER").replace(b"PLACEHOLDER", escaped.encode())
    assert reason_of(raw) is R.CARD_DATA_PRESENT


def test_redelivery_key_reads_the_key_fields_as_sent() -> None:
    from service.domain.messages import redelivery_key

    raw = encode(auth_message("T", amount="10.50"))
    strict = decode_authorization(raw)
    assert redelivery_key(raw) == ("T", strict.fingerprint, strict.message_id, "10.50", None)
    # Not the canonical text: no fingerprint of a decided request can equal this one, so a
    # redelivery written differently is always validated and looked up in PostgreSQL.
    assert redelivery_key(encode(auth_message("T", amount="10.5"))) != redelivery_key(raw)


@pytest.mark.parametrize("fields", [
    {"partial_approval_supported": True}, {"partial_approval_supported": False},
    {"authorization_type": "CLEARING", "final": False},
    {"authorization_type": "CLEARING", "final": True},
    {"amount": "1250", "currency": "JPY", "billing_amount": "7.50", "billing_currency": "EUR"},
    {"amount": "1250", "currency": "JPY", "billing_amount": "7.5", "billing_currency": "EUR"},
])
def test_redelivery_key_reads_the_optional_key_fields_as_the_strict_path(
        fields: dict[str, object]) -> None:
    from service.domain.messages import redelivery_key

    raw = encode(auth_message("T", **fields))  # type: ignore[arg-type]
    strict = decode_authorization(raw)
    key = redelivery_key(raw)
    assert key is not None
    canonical = fields.get("billing_amount") != "7.5"
    # As sent in the canonical text, the key's fingerprint is the request's; "7.5" is not:
    # no decided request's can equal it, and the keyed decoding hashes the request again.
    assert (key.fingerprint == strict.fingerprint) is canonical
    assert decode_authorization(raw, key=key).fingerprint == strict.fingerprint
    assert key.billing_amount == fields.get("billing_amount")


@pytest.mark.parametrize("fields", [{"partial_approval_supported": None}, {"final": "false"},
                                    {"billing_amount": 7.5, "billing_currency": "EUR"},
                                    {"billing_amount": "7.50", "billing_currency": None}])
def test_redelivery_key_leaves_an_optional_field_of_another_type_to_the_strict_path(
        fields: dict[str, object]) -> None:
    from service.domain.messages import redelivery_key

    assert redelivery_key(encode(auth_message("T", **fields))) is None  # type: ignore[arg-type]


def _variants() -> list[bytes]:
    good = encode(auth_message("T", amount="10.50"))
    hexed = auth_message("T", amount="10.50")
    hexed["body"]["card_number_hash"] = "sha256:" + "1234567890123" + "ab" * 20
    return [
        good,
        good.replace(b'"T"', b'"T", "transaction_id": "T"'),  # repeated key
        good.replace(b'"currency": "EUR"', b'"currency": "EUR", "currency": "EUR"'),
        good.replace(b'"T"', b'"\\u0054"'),  # an escape
        b"\xef\xbb\xbf" + good,  # byte order mark
        good.replace(b'"10.50"', b"10.50"),  # a number
        good.replace(b'"Amazon.es"', b'"Shop 4111111111111111"'),  # card data
        good.replace(b'"Amazon.es"', b'"Caf\xe9"'),  # not UTF-8
        good.replace(b'"Amazon.es"', b'"bad\x01"'),  # control character
        good.replace(b'"Amazon.es"', b"NaN"),
        good + b" x",  # trailing garbage
        encode(hexed),  # a digit run inside a hash: not card data
        good.replace(b'"merchant_category": "5411"', b'"merchant_category": 5411'),
    ]


@pytest.mark.parametrize("raw", _variants())
def test_redelivery_key_never_accepts_what_the_strict_path_reads_otherwise(raw: bytes) -> None:
    from service.domain.messages import redelivery_key

    key = redelivery_key(raw)
    try:
        strict = decode_authorization(raw)
    except InvalidMessage as exc:
        # A message the strict path refuses for its JSON or card data never gets a key; a
        # schema problem outside the key fields may (see test_pipeline: still a duplicate).
        assert key is None or exc.reason is R.SCHEMA_VIOLATION, exc.reason
        return
    assert key is None or key[:3] == (strict.transaction_id, strict.fingerprint,
                                      strict.message_id)
    if key is not None:  # decoding as the worker does, after the key: the same
        keyed = decode_authorization(raw, key=key)
        assert repr(keyed) == repr(strict) and keyed.fingerprint == strict.fingerprint
        assert key.amount == json.loads(raw)["body"]["amount"]  # as sent


def test_redelivery_key_refuses_repeated_keys_escapes_and_card_data() -> None:
    from service.domain.messages import redelivery_key

    variants = _variants()
    assert redelivery_key(variants[0]) is not None and redelivery_key(variants[11]) is not None
    for index in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10):
        assert redelivery_key(variants[index]) is None, index


@pytest.mark.parametrize("amount", ["10.00", "10", "0.50", "1E+1", "1.10E+1"])
def test_exact_amounts_that_are_plain_or_json_numbers_are_accepted(amount: str) -> None:
    raw = with_body(amount="PLACEHOLDER").replace(b'"PLACEHOLDER"', amount.encode())
    assert decode_authorization(raw).amount == Decimal(amount)


FULLWIDTH_PAN = "".join(chr(0xFF10 + int(d)) for d in PAN)
ARABIC_INDIC_PAN = "".join(chr(0x0660 + int(d)) for d in PAN)


@pytest.mark.parametrize(
    "raw_field",
    [
        b'"pan_extra": 4111111111111111.0',  # a decimal number
        b'"pan_extra": 4.111111111111111E15',  # with an exponent
        b'"pan_extra": 41111111111111110E-1',
        b'"pan_extra": [[{"deep": 4111111111111111.00}]]',
        b'"merchant": "4111.1111.1111.1111"',
        b'"merchant": "4111 1111-1111.1111"',
        ('"merchant": "' + FULLWIDTH_PAN + '"').encode(),
        ('"merchant": "Shop ' + ARABIC_INDIC_PAN + '"').encode(),
        ('"merchant": "4111\u00a01111\u20131111\u00a01111"').encode(),  # NBSP, en dash
        b'"4111111111111111": "key"',
    ],
)
def test_card_numbers_in_any_spelling_are_refused(raw_field: bytes) -> None:
    raw = with_body(merchant="Amazon.es").replace(b'"merchant": "Amazon.es"', raw_field)
    assert json.loads(raw)  # still JSON
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(raw)
    assert info.value.reason is R.CARD_DATA_PRESENT, raw_field
    from service.domain.messages import redelivery_key
    assert redelivery_key(raw) is None, "never recognised on the cheap path either"


@pytest.mark.parametrize(
    "raw",
    [
        # a repeated key that is a card number: the detail does not quote it
        with_body().replace(b'"body": {', b'"body": {"4111111111111111": 1, '
                                          b'"4111111111111111": 2, '),
        with_body().replace(b'"merchant":', b'"' + FULLWIDTH_PAN.encode() + b'": 1, "'
                            + FULLWIDTH_PAN.encode() + b'": 2, "merchant":'),
        with_body(currency="4111111111111111"),
        with_body(currency="4111-1111-1111-1112"),  # not Luhn-valid: refused, not quoted
        with_body(merchant_category="4111111111111112"),
    ],
)
def test_error_details_never_carry_card_numbers(raw: bytes) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(raw)
    for digits in ("4111111111111111", "4111111111111112", "411111111111"):
        assert digits not in str(info.value), info.value.detail
        assert digits not in info.value.detail
    assert FULLWIDTH_PAN not in info.value.detail


def test_a_deeply_nested_extra_field_never_raises_anything_but_invalid_message() -> None:
    from service.domain.messages import redelivery_key

    for depth in (253, 300, 1_000, 100_000):
        raw = with_body().replace(b'"merchant":', b'"nest": ' + b"[" * depth + b"]" * depth
                                  + b', "merchant":')
        assert redelivery_key(raw) is None, depth  # orjson writes back at most 254 levels
        try:
            decode_authorization(raw, max_bytes=1_000_000)
        except InvalidMessage as exc:
            assert exc.reason in (R.INVALID_JSON, R.SCHEMA_VIOLATION), depth


def test_a_refund_above_the_limit_waits_for_a_person() -> None:
    refund = with_body(authorization_type="REFUND", amount="999999999999999.00")
    with pytest.raises(InvalidMessage) as info:
        decode_authorization(refund)
    assert info.value.reason is R.LIMIT_EXCEEDED
    assert decode_authorization(refund, max_refund=Decimal("1E15")).amount
    assert decode_authorization(with_body(authorization_type="REFUND", amount="10000.00"))
    # A purchase is bounded by the funds, not by this limit.
    assert decode_authorization(with_body(amount="999999999999999.00"))


def test_redact_masks_long_digit_runs_in_any_script() -> None:
    from service.domain.pan import redact

    assert redact("duplicate key 4111111111111111") == "duplicate key [digits masked …1111]"
    assert "4111" not in redact(f"got {FULLWIDTH_PAN}!").replace("…1111", "")
    assert redact("offset 12345, amount 125.50") == "offset 12345, amount 125.50"


def test_a_currency_that_is_a_card_number_is_card_data() -> None:
    assert reason_of(with_body(currency=PAN)) is R.CARD_DATA_PRESENT


def test_numeric_network_identifiers_keep_the_fast_path() -> None:
    """A transaction id made of digits (as many networks send) is an id, not card data: the
    redelivery key is read for it, Luhn-valid or not."""
    from service.domain.messages import redelivery_key

    for txn in ("TXN-189020-00000001", "4111111111111111", "000123456789012345"):
        raw = encode(auth_message(txn, message_id=f"msg-{txn}"))
        key = redelivery_key(raw)
        assert key is not None and key.transaction_id == txn, txn


@pytest.mark.parametrize(("part", "value", "detail"), [
    ("body", "x", "body: Input should be a valid dictionary"),
    ("headers", [], "headers: Input should be a valid dictionary"),
    ("body", None, "body: Input should be a valid dictionary"),
])
def test_a_part_that_is_not_an_object_is_named_without_internal_names(
        part: str, value: object, detail: str) -> None:
    message = auth_message("TXN-1")
    message[part] = value
    with pytest.raises(InvalidMessage) as caught:
        decode_authorization(encode(message))
    assert caught.value.reason is DeadLetterReason.SCHEMA_VIOLATION
    assert caught.value.detail == detail


def test_fields_the_schema_does_not_name_are_allowed() -> None:
    message = auth_message("TXN-1")
    message["body"]["gateway_risk_score"] = 7
    message["headers"]["trace"] = {"span": "abc"}
    message["metadata"] = ["anything"]
    assert decode_authorization(encode(message)).transaction_id == "TXN-1"
