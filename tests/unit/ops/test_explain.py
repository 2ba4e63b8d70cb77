"""``payauth explain`` (``service/ops/explain.py``): its argument."""

from __future__ import annotations

import pytest

from tests.support.cli import refusal


def test_no_transaction_id_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(capsys, "explain")
    assert line.startswith("payauth explain: ") and "TXN_ID" in line


def test_two_transaction_ids_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(capsys, "explain", "T1", "T2").startswith("payauth: ")
