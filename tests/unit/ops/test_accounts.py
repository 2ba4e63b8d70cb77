"""``payauth accounts load`` (``service/ops/accounts.py``): an accounts file's balances keep
to their currency's minor unit, exactly (the same rule as a message's amount,
``money.fits_minor_unit``), and the command's arguments. Loading: tests/integration/ops/
test_accounts.py."""

from __future__ import annotations

from decimal import Decimal

import pytest

from service.ops.accounts import AccountsFileInvalid, parse
from tests.support.cli import refusal


def test_a_balance_within_its_minor_unit_loads_exactly() -> None:
    rows = parse("account_id,balance,currency\nA-1,125.500,EUR\nA-2,100,JPY\nA-3,1.234,KWD\n")
    assert [r.balance for r in rows] == [Decimal("125.500"), Decimal("100"), Decimal("1.234")]


def test_a_balance_beyond_its_minor_unit_is_refused_by_line() -> None:
    text = ("account_id,balance,currency\nA-1,1.001,EUR\nA-2,100.5,JPY\n"
            "A-3,1.0000000000000000000000000000000000001,EUR\n")
    with pytest.raises(AccountsFileInvalid) as info:
        parse(text)
    assert info.value.problems == ["line 2: EUR balances have at most 2 decimals",
                                   "line 3: JPY balances have at most 0 decimals",
                                   "line 4: EUR balances have at most 2 decimals"]


def test_no_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(capsys, "accounts", "load")
    assert line.startswith("payauth accounts load: ") and "FILE.csv" in line


def test_no_tool_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(capsys, "accounts").startswith("payauth accounts: ")
