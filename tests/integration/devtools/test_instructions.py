"""The count of PostgreSQL's instructions per message (``service/devtools/bench/
instructions.py``) on a server of its own under callgrind: the same tree twice counts the
same to the percent, and a purchase on a card with two limits counts far more than one
without, as its statement does more (docs/benchmark.md)."""

from __future__ import annotations

from service.devtools.bench import instructions
from tests.support.stack import ROOT


def test_the_same_tree_counts_the_same_and_more_work_counts_more() -> None:
    same = instructions.measure({"a": ROOT, "b": ROOT}, "cards", calls=2, batch=100)
    limited = instructions.measure({"a": ROOT}, "limits", calls=2, batch=100)
    assert same["a"] > 20_000, same
    assert abs(same["b"] / same["a"] - 1) < 0.02, same
    assert limited["a"] > 1.3 * same["a"], (limited, same)
