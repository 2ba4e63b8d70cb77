"""``payauth replay`` (``service/ops/replay.py``): every flag refused in one line when bad,
and parsed to its value when good. The replay itself: tests/integration/ops/test_replay.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.cli import build_parser
from tests.support.cli import refusal


@pytest.mark.parametrize(("argv", "names"), [
    (["--partitions", "0,x", "--to-earliest"], "--partitions"),
    (["--partitions", "0,,1", "--to-earliest"], "--partitions"),
    (["--partitions", "-1", "--to-earliest"], "--partitions"),
    (["--partitions", "2,2", "--to-earliest"], "--partitions"),
    (["--to-datetime", "yesterday"], "--to-datetime"),
    (["--shift-by", "ten"], "--shift-by"),
    (["--shift-by", "0"], "--shift-by"),
    (["--from-offset", "-1"], "--from-offset"),
    (["--to-offset", "1.5", "--shadow"], "--to-offset"),
])
def test_a_bad_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str],
                                         argv: list[str], names: str) -> None:
    line = refusal(capsys, "replay", *argv)
    assert line.startswith("payauth replay: ") and names in line


def test_an_unknown_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    line = refusal(capsys, "replay", "--to-earliest", "--no-such-flag")
    assert line.startswith("payauth: ") and "--no-such-flag" in line


def test_good_flags_parse_to_their_values() -> None:
    args = build_parser().parse_args(["replay", "--to-datetime", "2026-04-07T14:00:00",
                                      "--partitions", "0, 3", "--shift-by", "-5",
                                      "--from-offset", "0"])
    assert args.to_datetime == datetime(2026, 4, 7, 14, 0, tzinfo=UTC)  # no zone: UTC
    assert args.partitions == [0, 3]
    assert args.shift_by == -5 and args.from_offset == 0
    zoned = build_parser().parse_args(["replay", "--to-datetime", "2026-04-07T14:00:00Z"])
    assert zoned.to_datetime == datetime(2026, 4, 7, 14, 0, tzinfo=UTC)
