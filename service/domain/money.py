"""Exact money: ISO 4217 minor units and the bounds every amount must respect."""

from __future__ import annotations

import re
from decimal import Decimal
from functools import cache

import iso4217

# What an amount written as text may look like: "125.50", "1250", "0.5". No sign, no
# exponent, no leading zeros, no bare point ("10.", ".5"): a plain decimal.
PLAIN_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


class UnknownCurrency(ValueError):
    pass


@cache
def minor_unit(currency: str) -> int:
    """Decimals allowed for ``currency`` (JPY 0, EUR 2, KWD 3). Codes are upper case only.

    Codes without a minor unit (gold, SDR, test and "no currency" codes) are not card
    currencies and count as unknown.
    """
    if len(currency) != 3 or not currency.isascii() or not currency.isupper():
        # The value is not quoted: what is not a currency code may be anything (card data).
        raise UnknownCurrency("currency must be a three-letter upper-case ISO 4217 code")
    try:
        exponent = iso4217.Currency(currency).exponent
    except ValueError:
        raise UnknownCurrency(f"unknown ISO 4217 currency {currency!r}") from None
    if exponent is None:
        raise UnknownCurrency(f"{currency} is not a payment currency")
    return int(exponent)


def fits_minor_unit(amount: Decimal, unit: Decimal) -> bool:
    """Whether ``amount`` has no more significant decimals than its currency's ``unit``
    (``quantum(currency)``) allows (125.500 EUR does, 1.0000000000000000000000000000000000001
    EUR does not), for a message's amount and an account's balance alike. Exactly: rounding
    to the unit leaves the amount equal only when it had nothing beyond it, and the
    comparison is exact (never through ``normalize()``, which rounds to the context's 28
    digits: nothing may pass because arithmetic rounded it first). Counting the digits says
    the same at five times the cost (a test holds the two together). For a finite amount of
    at most ``MAX_AMOUNT`` (callers check first): rounded, it stays well within the default
    context's 28 digits (15 integral digits, at most 4 decimals), so ``quantize`` cannot
    raise; only the result's size is bounded, not the amount's exponent
    (1E-999999999999999999 rounds to 0.00, not equal: refused)."""
    return amount.quantize(unit) == amount


def format_amount(amount: Decimal, currency: str) -> str:
    """The canonical text of an amount in its currency's minor unit: "125.50", "1250"."""
    return str(amount.quantize(quantum(currency)))


def format_stored(text: str, currency: str) -> str:
    """``format_amount`` of an amount as PostgreSQL writes a numeric (a sign, digits, as
    many decimals as its scale, never an exponent): the text itself when it has exactly the
    currency's decimals already (nothing to round: the same text), read and rounded
    otherwise. Several amounts of each lifecycle decision come back so, and reading each into
    a Decimal to write it out again is most of what formatting it costs (docs/benchmark.md,
    "Design figures")."""
    decimals = minor_unit(currency)
    point = text.find(".")
    if (len(text) - point - 1 == decimals) if point > 0 else (decimals == 0 and text):
        return text
    return format_amount(Decimal(text), currency)


@cache  # a few dozen currencies; an unknown code raises, and is not kept
def quantum(currency: str) -> Decimal:
    """0.01 for EUR, 1 for JPY: what an amount in ``currency`` is rounded to (once per code;
    several times per authorization on the hot path otherwise)."""
    return Decimal(1).scaleb(-minor_unit(currency))
