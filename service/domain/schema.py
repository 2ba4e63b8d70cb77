"""The authorization request's schema (the contract's message format), as pydantic types.

``ENVELOPE.validate_python(document)`` checks a parsed document and returns it as plain
dicts of validated values, or raises ``pydantic.ValidationError``. The parts are
``TypedDict``s, not models: validating into dicts costs about half of building three model
instances per message, with the same rules and the same error locations and texts (but
for a part that is not an object: "body: Input should be a valid dictionary", no longer
naming a model class). (``typing_extensions.TypedDict``: pydantic needs it on Python 3.11.)
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, NotRequired

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StringConstraints,
    TypeAdapter,
)
from typing_extensions import TypedDict

from service.domain.money import (
    PLAIN_DECIMAL,
    UnknownCurrency,
    fits_minor_unit,
    minor_unit,
    quantum,
)
from service.domain.vocabulary import (
    COUNTRY_PATTERN,
    IDENTIFIER_CHARS,
    IDENTIFIER_MAX_LENGTH,
    MAX_AMOUNT,
    NAMES_ORIGINAL,
    ORIGINAL_REQUIRED,
    PARTIAL_APPROVAL,
    ZERO_AMOUNT,
    AuthorizationType,
)

# The same rule as the schema's IDENTIFIER_PATTERN, spelled for speed: a length bound and an
# unbounded character class check faster than the bounded pattern
# (docs/benchmark.md, "Design figures").
Identifier = Annotated[str, StringConstraints(
    strict=True, min_length=1, max_length=IDENTIFIER_MAX_LENGTH,
    pattern=f"^{IDENTIFIER_CHARS}+$")]
# Free text (merchant name): any printable text, no control characters.
Text = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$"),
]

# An amount sent as a string is a PLAIN_DECIMAL, as the contract says. (A JSON number is
# whatever JSON allows; it is parsed exactly, never as a float.)
_PLAIN_DECIMAL_HINT = 'amount string must be a plain decimal like "125.50"'


def _exact_amount(value: object) -> Decimal:
    if isinstance(value, str):  # first: nearly every message sends its amount as text
        if len(value) > 40 or not PLAIN_DECIMAL.fullmatch(value):
            raise ValueError(_PLAIN_DECIMAL_HINT)
        return Decimal(value)
    if isinstance(value, (bool, float)):
        raise ValueError("amount must be an exact decimal (JSON number or string), not a float")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        return value
    raise ValueError("amount must be a JSON number or a decimal string")


ExactAmount = Annotated[Decimal, BeforeValidator(_exact_amount)]

# Fields the schema does not name are allowed (and not kept): a gateway may add its own.
_OPEN = ConfigDict(extra="ignore")


class Headers(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]  # pydantic's way to configure one

    message_id: Identifier
    correlation_id: NotRequired[Identifier | None]
    timestamp: NotRequired[datetime | None]
    source: NotRequired[Text | None]


class BodyFields(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]

    transaction_id: Identifier
    card_number_hash: Annotated[
        str, StringConstraints(strict=True, min_length=1, max_length=128, pattern=r"^[!-~]+$")
    ]
    account_id: Identifier
    amount: ExactAmount
    currency: Annotated[str, StringConstraints(strict=True)]
    merchant: Text
    merchant_category: Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9]{4}$")]
    authorization_type: AuthorizationType
    # The message a REVERSAL, CLEARING or INCREMENTAL refers to: required for REVERSAL and
    # INCREMENTAL, optional (absent or null: a forced clearing) for CLEARING, refused on the
    # other kinds.
    original_transaction_id: NotRequired[Identifier | None]
    # PURCHASE and AUTHORIZATION only: the merchant accepts an approval of part of the
    # amount (absent or null: false).
    partial_approval_supported: NotRequired[StrictBool | None]
    # The network's conversion into the cardholder's currency, both or neither.
    billing_amount: NotRequired[ExactAmount | None]
    billing_currency: NotRequired[Annotated[str, StringConstraints(strict=True)] | None]
    # CLEARING only: false for one of several clearings of a hold (absent or null: true).
    final: NotRequired[StrictBool | None]
    # The card a network token names (never a card number: the card-number check reads it
    # as every field) and the merchant's country: what the card controls judge.
    card_id: NotRequired[Identifier | None]
    merchant_country: NotRequired[Annotated[
        str, StringConstraints(strict=True, pattern=COUNTRY_PATTERN)] | None]


def _original_fits_kind(body: BodyFields) -> None:
    kind, original = body["authorization_type"], body.get("original_transaction_id")
    if original is None:
        if kind in ORIGINAL_REQUIRED:
            raise ValueError(f"original_transaction_id is required for {kind}")
        return
    if kind not in NAMES_ORIGINAL:
        raise ValueError(f"original_transaction_id is not allowed for {kind}")
    if original == body["transaction_id"]:
        raise ValueError("original_transaction_id must name another transaction")


def _flags_fit_kind(body: BodyFields) -> None:
    kind = body["authorization_type"]
    if body.get("partial_approval_supported") is not None and kind not in PARTIAL_APPROVAL:
        raise ValueError(f"partial_approval_supported is not allowed for {kind}")
    if body.get("final") is not None and kind is not AuthorizationType.CLEARING:
        raise ValueError(f"final is not allowed for {kind}")


def _amount_in(amount: Decimal, currency: str, name: str, zero: bool) -> None:
    """An amount as the contract wants it: finite, exactly 0 for the zero-amount kinds and
    above 0 for the others, bounded, and in its currency's minor unit."""
    if not amount.is_finite():
        raise ValueError(f"{name} must be finite (NaN and Infinity are not amounts)")
    if zero and amount != 0:
        raise ValueError(f"{name} must be 0 for this kind")
    if not zero and amount <= 0:
        raise ValueError(f"{name} must be greater than zero")
    if amount > MAX_AMOUNT:
        raise ValueError(f"{name} must not exceed {MAX_AMOUNT}")
    try:
        unit = quantum(currency)
    except UnknownCurrency as exc:
        raise ValueError(str(exc)) from None  # names the code only when it has a code's shape
    if not fits_minor_unit(amount, unit):
        raise ValueError(f"{currency} amounts have at most {minor_unit(currency)} decimals")


def _amount_fits_currency(body: BodyFields) -> BodyFields:
    _original_fits_kind(body)
    _flags_fit_kind(body)
    zero = body["authorization_type"] in ZERO_AMOUNT
    _amount_in(body["amount"], body["currency"], "amount", zero)
    billing_amount, billing_currency = body.get("billing_amount"), body.get("billing_currency")
    if (billing_amount is None) != (billing_currency is None):
        raise ValueError("billing_amount and billing_currency go together")
    if billing_amount is not None and billing_currency is not None:
        _amount_in(billing_amount, billing_currency, "billing_amount", zero)
    return body


Body = Annotated[BodyFields, AfterValidator(_amount_fits_currency)]


class Envelope(TypedDict):
    __pydantic_config__ = _OPEN  # type: ignore[misc]

    headers: Headers
    body: Body


ENVELOPE: TypeAdapter[Envelope] = TypeAdapter(Envelope)
BODY: TypeAdapter[BodyFields] = TypeAdapter(Body)
