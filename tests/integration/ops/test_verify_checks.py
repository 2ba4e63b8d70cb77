"""Each check of ``payauth verify`` that the issuer's day and the card controls added can
fail: a day of holds, an increment, a partial clearing, a partial approval and a limit,
decided by a real worker, passes; then one row is set wrong, as a bug would have written
it, and verify names that check (a check that cannot fail proves nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.workers import payauth

# (the check's name in verify's FAIL line, the statement that breaks it; {hold}, {part},
# {buy}: the hold, its partial clearing, the partial approval)
BREAKS = {
    "held >= 0 per hold and never more than authorized and incremented":
        # (the table's own check refuses it first: verify stands behind a dropped one)
        "ALTER TABLE holds DROP CONSTRAINT holds_remaining_check; "
        "UPDATE holds SET remaining = amount + incremented + 1 WHERE txn_id = '{hold}'",
    "what each hold placed and added = what remains + what reversals, clearings and its "
    "end released":
        "UPDATE holds SET incremented = incremented + 5 WHERE txn_id = '{hold}'",
    "what a hold's clearings and reversals released never above what it held":
        "UPDATE lifecycle_messages SET amount_applied = 500 WHERE txn_id = '{part}'",
    "a partial approval never above the available balance it read":
        "UPDATE processed_transactions SET input_balance = 10 WHERE txn_id = '{buy}'",
    "each spending limit's usage is what its charges count":
        # (below its charges: a period older than the oldest record kept may hold more)
        "UPDATE limit_usage SET amount = amount - 1",
    "a limit counts an approved message, never more than was approved":
        "UPDATE limit_charges SET amount = 1000 WHERE charged_by = '{hold}'",
    "no approval past a limit but an advice's, by the usage it read":
        "UPDATE processed_transactions SET input_limit_reads = ARRAY(SELECT ROW(r.limit_id, "
        "r.period_start, r.max_amount, r.max_count, r.max_amount, r.used_count)::limit_read "
        "FROM unnest(input_limit_reads) AS r) WHERE txn_id = '{hold}'",
}


@pytest.mark.parametrize("check", sorted(BREAKS))
def test_each_check_names_what_breaks_it(check: str, env: stack.Env, spawn_worker,
                                         tmp_path: Path) -> None:
    t = lc.names("hold", "inc", "part", "buy", "acc", "acc2", "card", "lim")
    lc.seed(env, (t["acc"], "1000.00"), (t["acc2"], "40.00"))
    (tmp_path / "cards.csv").write_text(f"{t['card']},{t['acc']}\n")
    (tmp_path / "limits.csv").write_text(f"{t['lim']},CARD,{t['card']},DAY,500.00,10\n")
    for args in (("cards", "load", str(tmp_path / "cards.csv")),
                 ("limits", "load", str(tmp_path / "limits.csv"))):
        done = payauth(env, *args, PAYAUTH_DATABASE_URL=env.dsn)
        assert done.returncode == 0, done.stdout + done.stderr
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", t["acc"], "50.00", card_id=t["card"]),
        lc.msg(t["inc"], "INCREMENTAL", t["acc"], "20.00", t["hold"], card_id=t["card"]),
        lc.msg(t["part"], "CLEARING", t["acc"], "30.00", t["hold"], final=False),
        lc.msg(t["buy"], "PURCHASE", t["acc2"], "100.00", partial_approval_supported=True)])
    events = lc.events(env, expect=4)
    assert (events[t["buy"]]["amount_approved"], events[t["buy"]]["partial"]) == \
        ("40.00", True)
    lc.verified(env)

    *before, breaking = BREAKS[check].format(
        hold=t["hold"], part=t["part"], buy=t["buy"]).split("; ")
    for statement in before:
        stack.fetch(env.dsn, statement)
    assert stack.fetch(env.dsn, breaking + " RETURNING 1"), breaking  # a row was broken
    broken = payauth(env, "verify")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert any(check in line for line in failed), failed
