"""``payauth verify`` (``service/ops/verify.py``) takes no flag: an unknown one is one line."""

from __future__ import annotations

import pytest

from tests.support.cli import refusal


def test_an_unknown_flag_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(capsys, "verify", "--fix").startswith("payauth: ")


def test_an_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(capsys, "verfiy")
    assert line.startswith("payauth: ") and "verfiy" in line
