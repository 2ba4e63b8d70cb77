"""Whether a control (a spending limit, a card block) names any of a batch's ids is asked by
joining the ids (``unnest``), never by ``scope_id = ANY(…)``: each statement of the batch
is planned for its own values (``adapters/postgres.py``), and the planner estimates
``= ANY`` of a batch's thousand ids one by one against the column's most common values
(a scope_id repeats), which cost every batch 2.5 ms of planning on ``spending_limits`` alone
(docs/benchmark.md, "Where PostgreSQL's CPU per authorization goes")."""

from __future__ import annotations

import re
from pathlib import Path

SQL = Path(__file__).resolve().parents[2] / "sql"
# A control's scope_id compared with a whole array: = ANY(…) or IN (SELECT unnest(…)).
COMPARED_WITH_AN_ARRAY = re.compile(r"scope_id\s*=\s*ANY\s*\(|scope_id\s+IN\s*\(\s*SELECT",
                                    re.IGNORECASE)


def _statements(text: str) -> str:
    """The SQL without its comments (a comment may say what is not done)."""
    return re.sub(r"--[^\n]*", "", text)


def test_no_statement_compares_a_controls_scope_with_a_batchs_array() -> None:
    found = []
    for path in sorted(SQL.glob("*.sql")):
        text = _statements(path.read_text())
        found += [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}"
                  for m in COMPARED_WITH_AN_ARRAY.finditer(text)]
    assert found == []


def test_the_check_finds_the_comparison_it_forbids() -> None:
    """(The pattern is alive: it finds what the definitions once said.)"""
    old = "EXISTS (SELECT 1 FROM spending_limits l WHERE l.scope_id = ANY(p_account_ids))"
    assert COMPARED_WITH_AN_ARRAY.search(_statements(old))
    assert not COMPARED_WITH_AN_ARRAY.search(_statements("-- l.scope_id = ANY(ids)"))
