"""``payauth dlq redrive`` (``service/ops/redrive.py``): its flags. The redrive itself:
tests/integration/ops/test_redrive.py."""

from __future__ import annotations

import pytest

from service.cli import build_parser
from service.domain.errors import DeadLetterReason
from tests.support.cli import refusal


@pytest.mark.parametrize(("argv", "names"), [
    (["--reason", "TOO-LARGE"], "--reason"),
    (["--from-offset", "-3"], "--from-offset"),
    (["--to-offset", "x"], "--to-offset"),
    (["--partitions", "0;1"], "--partitions"),
])
def test_a_bad_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str],
                                         argv: list[str], names: str) -> None:
    line = refusal(capsys, "dlq", "redrive", *argv)
    assert line.startswith("payauth dlq redrive: ") and names in line


def test_every_dead_letter_reason_is_accepted() -> None:
    for reason in DeadLetterReason:
        args = build_parser().parse_args(["dlq", "redrive", "--reason", reason.value])
        assert args.reason == reason.value


def test_good_flags_parse_to_their_values() -> None:
    args = build_parser().parse_args(["dlq", "redrive", "--partitions", "0", "--from-offset",
                                      "4", "--to-offset", "9"])
    assert (args.partitions, args.from_offset, args.to_offset) == ([0], 4, 9)
