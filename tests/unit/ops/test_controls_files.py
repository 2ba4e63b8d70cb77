"""The cards', limits' and blocks' files as ``payauth cards load``, ``payauth limits load``
and ``payauth blocks load|lift`` read them: every bad line named with its reason, nothing
loaded then."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from service.ops import blocks, cards, csv_file, limits


def test_a_cards_file_with_and_without_its_optional_columns() -> None:
    rows = cards.parse("card_id,account_id,status,expires_on\n"
                       "C1,A1\n"
                       "C2,A1,FROZEN,2028-03-31\n"
                       "\n"
                       "C3,A2,,2027-01-31\n")
    assert [(r.line, r.card_id, r.account_id, r.status, r.expires_on) for r in rows] == [
        (2, "C1", "A1", "ACTIVE", None), (3, "C2", "A1", "FROZEN", date(2028, 3, 31)),
        (5, "C3", "A2", "ACTIVE", date(2027, 1, 31))]


def test_every_bad_card_line_is_named() -> None:
    with pytest.raises(csv_file.FileInvalid) as caught:
        cards.parse("C1,A1\n"
                    "C2,A1,MELTED\n"
                    "C3,A1,ACTIVE,31/01/2027\n"
                    "C1,A2\n"
                    "C 4,A1\n"
                    "C5\n")
    assert caught.value.problems == [
        "line 2: status must be one of ACTIVE, FROZEN, LOST, STOLEN, CLOSED",
        "line 3: expires_on must be a date like 2028-03-31",
        "line 4: card_id C1 already on line 1",
        "line 5: card_id must be 1 to 64 printable ASCII characters, no spaces (a token, "
        "never a card number)",
        "line 6: expected the columns card_id,account_id[,status[,expires_on]], got 1"]


def test_a_limits_file() -> None:
    rows = limits.parse("L1,CARD,C1,DAY,500.00,10\n"
                        "L2,ACCOUNT,A1,MONTH,,3,7995\n"
                        "L3,ACCOUNT,A1,TRANSACTION,45,\n")
    assert [(r.limit_id, r.scope, r.period, r.max_amount, r.max_count, r.merchant_category)
            for r in rows] == [("L1", "CARD", "DAY", Decimal("500.00"), 10, None),
                               ("L2", "ACCOUNT", "MONTH", None, 3, "7995"),
                               ("L3", "ACCOUNT", "TRANSACTION", Decimal("45"), None, None)]


@pytest.mark.parametrize(("line", "reason"), [
    ("L1,CARD,C1,YEAR,1,", "period must be one of TRANSACTION, DAY, WEEK, MONTH"),
    ("L1,CARDHOLDER,C1,DAY,1,", "scope must be one of CARD, ACCOUNT"),
    ("L1,CARD,C1,DAY,,", "a limit needs max_amount, max_count or both"),
    ("L1,CARD,C1,DAY,-5,", 'max_amount must be a plain decimal like "500.00", not negative'),
    ("L1,CARD,C1,DAY,NaN,", 'max_amount must be a plain decimal like "500.00", not negative'),
    ("L1,CARD,C1,DAY,,2.5", "max_count must be a whole number, not negative"),
    ("L1,CARD,C1,DAY,5,,gambling", "merchant_category must be four digits (ISO 18245), or "
                                   "empty for all"),
])
def test_a_bad_limit_line_is_named(line: str, reason: str) -> None:
    with pytest.raises(csv_file.FileInvalid) as caught:
        limits.parse(line + "\n")
    assert caught.value.problems == [f"line 1: {reason}"]


def test_a_blocks_file_with_its_header() -> None:
    rows = blocks.parse("scope,scope_id,kind,value\n"
                        "CARD,C1,CATEGORY,7995\n"
                        "ACCOUNT,A1,COUNTRY,KP\n")
    assert [(r.line, r.scope, r.scope_id, r.kind, r.value) for r in rows] == [
        (2, "CARD", "C1", "CATEGORY", "7995"), (3, "ACCOUNT", "A1", "COUNTRY", "KP")]


def test_every_bad_block_line_is_named() -> None:
    """A value spelled otherwise than a message carries it would never match one."""
    with pytest.raises(csv_file.FileInvalid) as caught:
        blocks.parse("CARD,C1,CATEGORY,7995\n"
                     "CARD,C1,COUNTRY,kp\n"
                     "CARD,C1,CATEGORY,799\n"
                     "WALLET,C1,CATEGORY,7995\n"
                     "CARD,C1,MERCHANT,ACME\n"
                     "CARD,C1,CATEGORY,7995\n"
                     "CARD,C1,COUNTRY\n")
    assert caught.value.problems == [
        "line 2: a country is two capital letters (ISO 3166-1), like KP",
        "line 3: a category is four digits (ISO 18245), like 7995",
        "line 4: scope must be one of CARD, ACCOUNT",
        "line 5: kind must be one of CATEGORY, COUNTRY",
        "line 6: scope CARD C1 CATEGORY 7995 already on line 1",
        "line 7: expected the columns scope,scope_id,kind,value, got 3"]
