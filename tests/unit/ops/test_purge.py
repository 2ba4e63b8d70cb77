"""``payauth purge`` (``service/ops/purge.py``, the retention in
``service/adapters/retention.py``): its flags. The purge itself:
tests/integration/ops/test_purge.py."""

from __future__ import annotations

import pytest

from service.cli import build_parser
from tests.support.cli import refusal


@pytest.mark.parametrize(("argv", "names"), [
    (["--batch-size", "-5"], "--batch-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "many"], "--batch-size"),
    (["--pause", "-1"], "--pause"),
    (["--pause", "nan"], "--pause"),
    (["--pause", "inf"], "--pause"),
])
def test_a_bad_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str],
                                         argv: list[str], names: str) -> None:
    line = refusal(capsys, "purge", *argv)
    assert line.startswith("payauth purge: ") and names in line


def test_good_flags_parse_to_their_values() -> None:
    args = build_parser().parse_args(["purge", "--batch-size", "1", "--pause", "0"])
    assert (args.batch_size, args.pause) == (1, 0.0)
