"""Exact money: ISO 4217 minor units and the bounds every amount must respect."""

from __future__ import annotations

from decimal import Decimal
from functools import cache

import iso4217

# Amounts are stored as numeric(19,4) in the ledger: at most 15 integer digits. Bounding here
# (for credits as much as debits) keeps Decimal("1e400"), which *is* finite, out of the
# database instead of turning it into a numeric overflow that would never stop retrying.
MAX_AMOUNT = Decimal("999999999999999")


class UnknownCurrency(ValueError):
    pass


@cache
def minor_unit(currency: str) -> int:
    """Decimals allowed for ``currency`` (JPY 0, EUR 2, KWD 3). Codes are upper case only.

    Codes without a minor unit (gold, SDR, test and "no currency" codes) are not card
    currencies and count as unknown.
    """
    if len(currency) != 3 or not currency.isascii() or not currency.isupper():
        raise UnknownCurrency(f"currency must be an upper-case ISO 4217 code, got {currency!r}")
    try:
        exponent = iso4217.Currency(currency).exponent
    except ValueError:
        raise UnknownCurrency(f"unknown ISO 4217 currency {currency!r}") from None
    if exponent is None:
        raise UnknownCurrency(f"{currency} is not a payment currency")
    return int(exponent)


def decimals_of(amount: Decimal) -> int:
    """Significant decimals: 125.50 has 1, 125.5 has 1, 125 has 0, 1.234 has 3."""
    exponent = amount.normalize().as_tuple().exponent
    assert isinstance(exponent, int)  # finite amounts only; callers check first
    return max(0, -exponent)


def format_amount(amount: Decimal, currency: str) -> str:
    """The canonical text of an amount in its currency's minor unit: "125.50", "1250"."""
    return str(amount.quantize(Decimal(1).scaleb(-minor_unit(currency))))
