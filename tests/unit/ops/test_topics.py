"""``payauth topics`` (``service/ops/topics.py``): its flags."""

from __future__ import annotations

import pytest

from service.cli import build_parser
from tests.support.cli import refusal


@pytest.mark.parametrize(("argv", "names"), [
    (["--partitions", "0"], "--partitions"),
    (["--partitions", "twelve"], "--partitions"),
    (["--wait", "-1"], "--wait"),
])
def test_a_bad_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str],
                                         argv: list[str], names: str) -> None:
    line = refusal(capsys, "topics", *argv)
    assert line.startswith("payauth topics: ") and names in line


def test_good_flags_parse_to_their_values() -> None:
    args = build_parser().parse_args(["topics", "--partitions", "24", "--wait", "1.5"])
    assert (args.partitions, args.wait) == (24, 1.5)
