"""Each check of ``payauth verify`` can fail (a check that cannot fail proves nothing): a
day of holds, an increment, a partial clearing, a partial approval, a limit, a purchase, its
partial reversal and a decline, decided by a real worker, passes; then a row is set wrong,
as a bug would have written it, and verify names the check it breaks. (The checks broken in
tests/integration/ops/test_verify.py are not repeated here.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.workers import payauth

# (the check's name in verify's FAIL line, the statements that break it, "; " apart; {hold},
# {part}, {buy}, {pur}, {rev}, {big}: the hold, its partial clearing, the partial approval,
# a purchase, its partial reversal, a declined purchase; {acc2}: the partial approval's
# account. Where a table's own constraint refuses the row, it is dropped first: verify
# stands behind it.)
BREAKS = {
    "held >= 0 per hold and never more than authorized and incremented":
        "ALTER TABLE holds DROP CONSTRAINT holds_remaining_check; "
        "UPDATE holds SET remaining = amount + incremented + 1 WHERE txn_id = '{hold}'",
    "what each hold placed and added = what remains + what reversals, clearings and its "
    "end released":
        "UPDATE holds SET incremented = incremented + 5 WHERE txn_id = '{hold}'",
    "each hold's amount and increments are what its messages approved":
        "UPDATE holds SET incremented = incremented + 400, remaining = remaining + 400 "
        "WHERE txn_id = '{hold}'",
    "what a hold's clearings and reversals released never above what it held":
        "UPDATE lifecycle_messages SET amount_applied = 500 WHERE txn_id = '{part}'",
    "an approval (a partial one too) never above what was asked nor the available "
    "balance it read":
        "UPDATE processed_transactions SET input_balance = 10 WHERE txn_id = '{buy}'",
    "each spending limit's usage is what its charges count":
        "UPDATE limit_usage SET amount = amount - 1",
    "a limit counts an approved message, never more than was approved":
        "UPDATE limit_charges SET amount = 1000 WHERE charged_by = '{hold}'",
    "no approval past a limit but an advice's, by the usage it read":
        "UPDATE processed_transactions SET input_limit_reads = ARRAY(SELECT ROW(r.limit_id, "
        "r.period_start, r.max_amount, r.max_count, r.max_amount, r.used_count)::limit_read "
        "FROM unnest(input_limit_reads) AS r) WHERE txn_id = '{hold}'",
    "a hold ends at most once":
        "UPDATE lifecycle_messages SET ended_hold = true WHERE txn_id = '{part}'",
    "no ledger entry for a hold":
        "UPDATE ledger_entries SET txn_id = '{hold}' WHERE txn_id = '{pur}'",
    "a purchase is credited back at most its amount":
        "UPDATE ledger_entries SET amount = 50 WHERE txn_id = '{rev}'",
    "available below zero only through advices and clearings":
        "UPDATE holds SET account_id = '{acc2}' WHERE txn_id = '{hold}'",
    "no clearing waits for its original although it has been decided":
        "INSERT INTO early_clearings (txn_id, original_txn_id, account_id, currency, amount, "
        "final, state) VALUES ('{big}-early', '{pur}', '{acc}', 'EUR', 1, true, 'WAITING')",
    "no negative (or NaN) balance but through a clearing":
        "UPDATE accounts SET balance = -1 WHERE account_id = '{acc2}'",
    "at most one ledger entry per transaction":
        "ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_txn_id_key; "
        "INSERT INTO ledger_entries SELECT * FROM ledger_entries WHERE txn_id = '{pur}'",
    "at most one dedup record per transaction, whichever period holds it":
        "INSERT INTO processed_transactions SELECT (jsonb_populate_record(p, "
        "jsonb_build_object('dedup_period', p.dedup_period - interval '3 days'))).* "
        "FROM processed_transactions p WHERE p.txn_id = '{pur}'",
    "every processed transaction has a result":
        "ALTER TABLE processed_transactions DROP CONSTRAINT processed_transactions_check; "
        "UPDATE processed_transactions SET decline_reason = NULL WHERE txn_id = '{big}'",
    "every approved transaction has its ledger entry, of its kind, with the approved "
    "amount and account":
        "UPDATE ledger_entries SET amount = amount + 1 WHERE txn_id = '{pur}'",
    "no ledger entry for a declined transaction":
        "UPDATE ledger_entries SET txn_id = '{big}' WHERE txn_id = '{pur}'",
}


# More ways to break a check, each one the check once let through (as BREAKS).
MORE_BREAKS = [
    # a full approval (no partial_approval_supported) above the balance it read
    ("an approval (a partial one too) never above what was asked nor the available "
     "balance it read",
     "UPDATE processed_transactions SET input_balance = 5 WHERE txn_id = '{pur}'"),
    # more approved than asked, posted as approved
    ("an approval (a partial one too) never above what was asked nor the available "
     "balance it read",
     "UPDATE processed_transactions SET amount_approved = 20 WHERE txn_id = '{pur}'"),
    # charges whose usage is gone
    ("each spending limit's usage is what its charges count", "DELETE FROM limit_usage"),
    # a message counted twice in a period that began before the oldest record kept (today's
    # here: every record is of today)
    ("each spending limit's usage is what its charges count",
     "UPDATE limit_usage SET amount = amount + 10, count = count + 1"),
    # a charge whose decision kept no limit it read
    ("a limit counts a message in a limit and period its decision read",
     "UPDATE processed_transactions SET input_limit_reads = NULL WHERE txn_id = '{inc}'"),
    # a charge in another period than the one its decision read
    ("a limit counts a message in a limit and period its decision read",
     "UPDATE limit_charges SET period_start = period_start - 1 WHERE charged_by = '{hold}'"),
    # a hold ended with no message that ended it
    ("a hold ends at most once",
     "UPDATE holds SET state = 'CLEARED', released = remaining, remaining = 0, "
     "ended_at = now() WHERE txn_id = '{hold}'"),
    # a purchase's debit posted as a credit of the same amount
    ("every approved transaction has its ledger entry, of its kind, with the approved "
     "amount and account",
     "UPDATE ledger_entries SET type = 'REFUND', amount = -amount WHERE txn_id = '{pur}'"),
]


@pytest.mark.parametrize(("check", "statements"),
                         [*sorted(BREAKS.items()), *MORE_BREAKS])
def test_each_check_names_what_breaks_it(check: str, statements: str, env: stack.Env,
                                         spawn_worker, tmp_path: Path) -> None:
    t = lc.names("hold", "inc", "part", "buy", "pur", "rev", "big", "acc", "acc2", "card",
                 "lim")
    lc.seed(env, (t["acc"], "1000.00"), (t["acc2"], "40.00"))
    lc.controls(env, tmp_path, [f"{t['card']},{t['acc']}"],
                [f"{t['lim']},CARD,{t['card']},DAY,500.00,10"])
    lc.run(env, spawn_worker, [
        lc.msg(t["hold"], "AUTHORIZATION", t["acc"], "50.00", card_id=t["card"]),
        lc.msg(t["inc"], "INCREMENTAL", t["acc"], "20.00", t["hold"], card_id=t["card"]),
        lc.msg(t["part"], "CLEARING", t["acc"], "30.00", t["hold"], final=False),
        lc.msg(t["buy"], "PURCHASE", t["acc2"], "100.00", partial_approval_supported=True),
        lc.msg(t["pur"], "PURCHASE", t["acc"], "10.00"),
        lc.msg(t["rev"], "REVERSAL", t["acc"], "5.00", t["pur"]),
        lc.msg(t["big"], "PURCHASE", t["acc"], "5000.00")])
    events = lc.events(env, expect=7)
    assert events[t["big"]]["result"] == "DECLINED"
    assert (events[t["buy"]]["amount_approved"], events[t["buy"]]["partial"]) == \
        ("40.00", True)
    lc.verified(env)

    *before, breaking = statements.format(**t).split("; ")
    for statement in before:
        stack.fetch(env.dsn, statement)
    assert stack.fetch(env.dsn, breaking + " RETURNING 1"), breaking  # a row was broken
    broken = payauth(env, "verify")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert any(check in line for line in failed), failed
