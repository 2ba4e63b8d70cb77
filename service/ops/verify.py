"""``payauth verify``: the invariants of the money in the database.

Each check is one SQL query that returns the offending rows (none when it holds), so a
finding names the transaction or account to look at.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class Check:
    name: str
    sql: str


def _waiting_for_a_decided_original(table: str) -> str:
    """The rows of ``table`` (orphan_reversals, early_clearings: messages kept until their
    original comes) still WAITING although their original was decided on their account:
    a hold placed, or a purchase posted, of the same account and currency."""
    return f"""SELECT w.txn_id || ' waits for ' || w.original_txn_id || ', decided on '
                  || w.account_id
             FROM {table} w
            WHERE w.state = 'WAITING'
              AND (EXISTS (SELECT 1 FROM holds h
                            WHERE h.txn_id = w.original_txn_id
                              AND h.account_id = w.account_id AND h.currency = w.currency)
                   OR EXISTS (SELECT 1 FROM ledger_entries l
                               WHERE l.txn_id = w.original_txn_id AND l.type = 'PURCHASE'
                                 AND l.account_id = w.account_id
                                 AND l.currency = w.currency))"""


# The lifecycle's (docs/lifecycle.md). A hold's amount is always accounted for: what
# remains, what reversals released (at their decision, or as orphans when it was placed),
# and what its end released.
LIFECYCLE_CHECKS = (
    Check(
        "held >= 0 per hold and never more than authorized and incremented",
        """SELECT txn_id || ': ' || remaining || ' of ' || amount || ' + ' || incremented
             FROM holds
            WHERE remaining < 0 OR remaining > amount + incremented""",
    ),
    # What a hold holds at most is what its messages approved: its AUTHORIZATION or ADVICE,
    # and its INCREMENTALs (lifecycle_messages, never purged; a record of a version before
    # amount_approved approved its amount as sent).
    Check(
        "each hold's amount and increments are what its messages approved",
        """SELECT h.txn_id || ': ' || h.amount || ' + ' || h.incremented || ' held, '
                  || coalesce(m.approved::text, 'no message') || ' + '
                  || coalesce(i.added, 0) || ' approved'
             FROM holds h
             LEFT JOIN (SELECT txn_id, coalesce(amount_approved, amount) AS approved
                          FROM lifecycle_messages
                         WHERE kind IN ('AUTHORIZATION', 'ADVICE') AND result = 'APPROVED') m
                    ON m.txn_id = h.txn_id
             LEFT JOIN (SELECT original_txn_id, sum(amount_applied) AS added
                          FROM lifecycle_messages
                         WHERE kind = 'INCREMENTAL' AND result = 'APPROVED'
                         GROUP BY original_txn_id) i ON i.original_txn_id = h.txn_id
            WHERE m.approved IS DISTINCT FROM h.amount
               OR coalesce(i.added, 0) <> h.incremented""",
    ),
    # What a hold kept, it released once: what remains, plus what its reversals and its
    # clearings released (non-final ones as they came; a final one, or an expiry, at its
    # end), plus what orphan reversals and clearings that came before it took when it was
    # placed, is what it was approved and incremented.
    Check(
        "what each hold placed and added = what remains + what reversals, clearings and "
        "its end released",
        """SELECT h.txn_id || ': ' || h.amount || ' + ' || h.incremented || ' <> '
                  || h.remaining || ' + ' || coalesce(r.released, 0) || ' + '
                  || coalesce(o.applied, 0) || ' + ' || coalesce(e.applied, 0) || ' + '
                  || coalesce(c.released, 0) || ' + ' || coalesce(h.released, 0)
             FROM holds h
             LEFT JOIN (SELECT original_txn_id, sum(amount_applied) AS released
                          FROM lifecycle_messages WHERE kind = 'REVERSAL'
                         GROUP BY original_txn_id) r ON r.original_txn_id = h.txn_id
             LEFT JOIN (SELECT original_txn_id, sum(amount_applied) AS released
                          FROM lifecycle_messages WHERE kind = 'CLEARING' AND final = false
                         GROUP BY original_txn_id) c ON c.original_txn_id = h.txn_id
             LEFT JOIN (SELECT original_txn_id, sum(applied) AS applied FROM orphan_reversals
                         WHERE state = 'APPLIED' GROUP BY original_txn_id) o
                    ON o.original_txn_id = h.txn_id
             LEFT JOIN (SELECT original_txn_id, sum(applied) AS applied FROM early_clearings
                         WHERE state = 'APPLIED' GROUP BY original_txn_id) e
                    ON e.original_txn_id = h.txn_id
            WHERE h.amount + h.incremented <> h.remaining + coalesce(r.released, 0)
                  + coalesce(o.applied, 0) + coalesce(e.applied, 0) + coalesce(c.released, 0)
                  + CASE WHEN h.state IN ('CLEARED', 'EXPIRED') THEN coalesce(h.released, 0)
                         ELSE 0 END""",
    ),
    Check(
        "what a hold's clearings and reversals released never above what it held",
        """SELECT h.txn_id || ': released ' || sum(m.amount_applied) || ' of '
                  || min(h.amount + h.incremented)
             FROM holds h
             JOIN lifecycle_messages m ON m.original_txn_id = h.txn_id
                                      AND m.kind IN ('REVERSAL', 'CLEARING')
            GROUP BY h.txn_id
           HAVING sum(m.amount_applied) > min(h.amount + h.incremented)""",
    ),
    # Every approval that spends, not only a partial one (an advice is never declined; a
    # record of a version before amount_approved approved its amount as sent).
    Check(
        "an approval (a partial one too) never above what was asked nor the available "
        "balance it read",
        """SELECT x.txn_id || ': approved ' || x.approved || ' of ' || x.asked || ' asked, '
                  || x.available || ' available'
             FROM (SELECT txn_id, input_balance AS available,
                          coalesce(amount_approved, amount) AS approved,
                          payauth_account_amount(input_currency::text, currency::text,
                                                 amount, billing_currency::text,
                                                 billing_amount) AS asked
                     FROM processed_transactions
                    WHERE result = 'APPROVED'
                      AND authorization_type IN ('PURCHASE', 'AUTHORIZATION',
                                                 'INCREMENTAL')) x
            WHERE x.approved > x.available OR x.approved > x.asked OR x.approved <= 0""",
    ),
    Check(
        "available = balance - held (the accounts' held = what active holds keep)",
        """SELECT a.account_id || ': held ' || a.held || ' <> ' || coalesce(h.held, 0)
             FROM accounts a
             LEFT JOIN (SELECT account_id, sum(remaining) AS held FROM holds
                         WHERE state = 'ACTIVE' GROUP BY account_id) h USING (account_id)
            WHERE a.held <> coalesce(h.held, 0)""",
    ),
    Check(
        "a hold ends at most once",
        """SELECT h.txn_id || ': ' || h.state || ', ended by ' || count(m.txn_id)
                  || ' message(s)'
             FROM holds h
             LEFT JOIN lifecycle_messages m ON m.original_txn_id = h.txn_id AND m.ended_hold
            GROUP BY h.txn_id, h.state, h.ended_by
           HAVING count(m.txn_id) > 1
               OR (h.state = 'ACTIVE' AND count(m.txn_id) > 0)
               OR (h.state = 'EXPIRED' AND count(m.txn_id) > 0)
               OR (h.state IN ('CLEARED', 'REVERSED') AND count(m.txn_id) = 0
                   -- (a final clearing that came before the hold ended it as it was placed;
                   -- orphan reversals of all of it, as it was placed, with no message)
                   AND NOT EXISTS (SELECT 1 FROM early_clearings e
                                    WHERE e.txn_id = h.ended_by AND e.final
                                      AND e.state = 'APPLIED')
                   AND NOT (h.state = 'REVERSED' AND h.ended_by IS NULL
                            AND EXISTS (SELECT 1 FROM orphan_reversals o
                                         WHERE o.original_txn_id = h.txn_id
                                           AND o.state = 'APPLIED')))""",
    ),
    Check(
        "no ledger entry for a hold",
        """SELECT h.txn_id FROM holds h JOIN ledger_entries l ON l.txn_id = h.txn_id
           UNION ALL
           SELECT m.txn_id FROM lifecycle_messages m JOIN ledger_entries l USING (txn_id)
            WHERE m.kind IN ('AUTHORIZATION', 'ADVICE')""",
    ),
    Check(
        "a purchase is credited back at most its amount",
        """SELECT m.original_txn_id || ': ' || sum(l.amount) || ' credited of '
                  || min(-p.amount)
             FROM lifecycle_messages m
             JOIN ledger_entries l ON l.txn_id = m.txn_id AND l.type = 'REVERSAL'
             JOIN ledger_entries p ON p.txn_id = m.original_txn_id AND p.type = 'PURCHASE'
            GROUP BY m.original_txn_id
           HAVING sum(l.amount) > min(-p.amount)""",
    ),
    # A REVERSAL, CLEARING or INCREMENTAL moves money only on its own account: one that
    # named another account's original is a mismatch, one that named an original not
    # known yet is kept (an orphan, a clearing before its hold) and applies nothing to it
    # when it comes.
    Check(
        "a reversal, clearing or increment applies only to an original of its account",
        """SELECT m.txn_id || ' of ' || m.account_id || ' applied ' || m.amount_applied
                  || ' to ' || m.original_txn_id || ' of ' || o.account_id
             FROM lifecycle_messages m
             JOIN (SELECT txn_id, account_id FROM holds
                   UNION ALL
                   SELECT txn_id, account_id FROM ledger_entries WHERE type = 'PURCHASE') o
               ON o.txn_id = m.original_txn_id
            WHERE m.kind IN ('REVERSAL', 'CLEARING', 'INCREMENTAL')
              AND m.amount_applied <> 0 AND o.account_id <> m.account_id""",
    ),
    # The orphans an original applies are found, and applied, in the original's decision,
    # under its account's lock (sql/payauth_authorize.sql): one still waiting while its
    # original was approved on its account (a purchase posted, a hold placed) lost what it
    # should have released or credited. (An original declined, or of another account, voids
    # its orphans and changes nothing: one left waiting by a race with it moved no money.)
    Check("no reversal waits although its original has been decided",
          _waiting_for_a_decided_original("orphan_reversals")),
    # Likewise a clearing that came before its original: the original's decision applies
    # it (a hold placed net of it) or voids it (declined, another account, a purchase).
    Check("no clearing waits for its original although it has been decided",
          _waiting_for_a_decided_original("early_clearings")),
    Check(
        "available below zero only through advices and clearings",
        """SELECT b.account_id || ': available ' || b.available FROM account_balances b
            WHERE b.available < 0
              AND NOT EXISTS (SELECT 1 FROM holds h
                               WHERE h.account_id = b.account_id AND h.kind = 'ADVICE')
              AND NOT EXISTS (SELECT 1 FROM ledger_entries l
                               WHERE l.account_id = b.account_id AND l.type = 'CLEARING')""",
    ),
)


# Card controls (docs/operations.md, "Card controls and spending limits").
CONTROLS_CHECKS = (
    # (The purge takes the charges away with their dedup records, but a standing hold's;
    # what they counted is kept in purged_limit_charges, or is still in a partition it
    # detached and has not summed yet: every period's usage is its charges and what was
    # purged of them, a usage that is missing counting nothing.)
    Check(
        "each spending limit's usage is what its charges count",
        """SELECT coalesce(u.limit_id, c.limit_id) || ' ' || coalesce(u.period_start,
                  c.period_start) || ': usage ' || coalesce(u.amount, 0) || ' / '
                  || coalesce(u.count, 0) || ', charges ' || coalesce(c.amount, 0) || ' / '
                  || coalesce(c.count, 0) || ', purged ' || coalesce(c.purged_amount, 0)
                  || ' / ' || coalesce(c.purged_count, 0)
             FROM limit_usage u
             FULL JOIN (SELECT limit_id, period_start,
                               sum(amount) FILTER (WHERE NOT purged) AS amount,
                               sum(count) FILTER (WHERE NOT purged) AS count,
                               sum(amount) FILTER (WHERE purged) AS purged_amount,
                               sum(count) FILTER (WHERE purged) AS purged_count
                          FROM (SELECT limit_id, period_start, amount, count, false AS purged
                                  FROM limit_charges
                                UNION ALL
                                SELECT limit_id, period_start, amount, count, true
                                  FROM purged_limit_charges
                                UNION ALL
                                SELECT limit_id, period_start, amount, count, true
                                  FROM payauth_limit_charges_detached()) x
                         GROUP BY limit_id, period_start) c
                    USING (limit_id, period_start)
            WHERE coalesce(u.amount, 0)
                      <> coalesce(c.amount, 0) + coalesce(c.purged_amount, 0)
               OR coalesce(u.count, 0) <> coalesce(c.count, 0) + coalesce(c.purged_count, 0)""",
    ),
    Check(
        "a limit counts an approved message, never more than was approved",
        """SELECT c.charged_by || ' in ' || c.limit_id FROM limit_charges c
             JOIN processed_transactions p ON p.txn_id = c.charged_by
            WHERE p.result <> 'APPROVED' OR c.amount > coalesce(p.amount_approved, p.amount)""",
    ),
    # (What shadow replay judges a decision by: a charge in a limit and period its
    # decision's record does not say it read would be judged as if no limit applied.)
    Check(
        "a limit counts a message in a limit and period its decision read",
        """SELECT c.charged_by || ' in ' || c.limit_id || ' from ' || c.period_start
             FROM limit_charges c
             JOIN processed_transactions p ON p.txn_id = c.charged_by
            WHERE NOT EXISTS (
                  SELECT 1
                    FROM jsonb_array_elements(payauth_input_limits(p.input_limit_reads,
                                                                   p.input_limits)) AS l
                   WHERE l->>'limit_id' = c.limit_id
                     AND (l->>'period_start')::date = c.period_start)""",
    ),
    Check(
        "no approval past a limit but an advice's, by the usage it read",
        """SELECT p.txn_id || ' in ' || (l->>'limit_id')
             FROM processed_transactions p,
                  jsonb_array_elements(payauth_input_limits(p.input_limit_reads,
                                                            p.input_limits)) AS l
            WHERE p.result = 'APPROVED' AND p.authorization_type <> 'ADVICE'
              AND ((l->>'used_amount')::numeric + coalesce(p.amount_approved, p.amount)
                       > (l->>'max_amount')::numeric
                   OR (l->>'used_count')::integer + 1 > (l->>'max_count')::integer)""",
    ),
)


CHECKS = (
    Check(
        "at most one ledger entry per transaction",
        "SELECT txn_id FROM ledger_entries GROUP BY txn_id HAVING count(*) > 1",
    ),
    # (No foreign key says it since migration 015: the writers and a trigger on accounts do.)
    Check(
        "every ledger entry and hold names an account",
        """SELECT 'ledger entry ' || l.txn_id || ' of ' || l.account_id FROM ledger_entries l
            WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.account_id = l.account_id)
           UNION ALL
           SELECT 'hold ' || h.txn_id || ' of ' || h.account_id FROM holds h
            WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.account_id = h.account_id)""",
    ),
    Check(
        "balance = opening balance + ledger, per account",
        """SELECT a.account_id || ': balance ' || a.balance || ' <> opening '
                  || a.opening_balance || ' + ledger ' || coalesce(l.total, 0)
             FROM accounts a
             LEFT JOIN (SELECT account_id, sum(amount) AS total
                          FROM ledger_entries GROUP BY account_id) l USING (account_id)
            WHERE a.balance <> a.opening_balance + coalesce(l.total, 0)""",
    ),
    Check(
        "no negative (or NaN) balance but through a clearing",
        """SELECT a.account_id || ': ' || a.balance FROM accounts a
            WHERE a.balance = 'NaN'
               OR (a.balance < 0 AND NOT EXISTS (
                       SELECT 1 FROM ledger_entries l
                        WHERE l.account_id = a.account_id AND l.type = 'CLEARING'))""",
    ),
    # (The dedup store's key is (txn_id, dedup_period): no constraint says one record per
    # transaction across its periods, the claim's lookup of every period and its fence do.)
    Check(
        "at most one dedup record per transaction, whichever period holds it",
        """SELECT txn_id || ': ' || count(*) || ' records' FROM processed_transactions
            GROUP BY txn_id HAVING count(*) > 1""",
    ),
    Check(
        "every processed transaction has a result",
        """SELECT txn_id FROM processed_transactions
            WHERE result IS NULL OR result NOT IN ('APPROVED', 'DECLINED')
               OR (result = 'DECLINED' AND decline_reason IS NULL)""",
    ),
    # The amount posted is what was approved in the account's currency (a partial approval,
    # a conversion), or the amount as sent by a version before those.
    Check(
        "every approved transaction has its ledger entry, of its kind, with the approved "
        "amount and account",
        """SELECT p.txn_id FROM processed_transactions p
             LEFT JOIN ledger_entries l ON l.txn_id = p.txn_id
            WHERE p.result = 'APPROVED'
              AND p.authorization_type IN ('PURCHASE', 'REFUND', 'CLEARING')
              AND (l.txn_id IS NULL OR l.account_id <> p.account_id
                   OR l.type <> p.authorization_type
                   OR abs(l.amount) <> coalesce(p.amount_approved, p.amount)
                   OR l.currency <> coalesce(p.input_currency, p.currency))""",
    ),
    Check(
        "no ledger entry for a declined transaction",
        """SELECT p.txn_id FROM processed_transactions p
             JOIN ledger_entries l ON l.txn_id = p.txn_id
            WHERE p.result = 'DECLINED'""",
    ),
    *LIFECYCLE_CHECKS,
    *CONTROLS_CHECKS,
)


@dataclass(frozen=True)
class Finding:
    check: str
    examples: list[str]
    count: int


# Every check reads one snapshot, taken once the charges are locked against a purge's
# detach (a partition detached after the snapshot would drop out of what it reads of
# them: the catalog is read as it is now). A detached table of charges summed and dropped
# after the snapshot was taken cannot be read (payauth_limit_charges_detached): the checks
# are run again on a new snapshot, this many times in all.
_ATTEMPTS = 3


async def verify(dsn: str, *, examples: int = 5) -> list[tuple[str, Finding | None]]:
    conn = await asyncpg.connect(dsn)
    try:
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await _run_checks(conn, examples)
            except asyncpg.UndefinedTableError:
                if attempt == _ATTEMPTS:
                    raise
        raise AssertionError("unreachable")
    finally:
        await conn.close()


async def _run_checks(conn: asyncpg.Connection,
                      examples: int) -> list[tuple[str, Finding | None]]:
    out: list[tuple[str, Finding | None]] = []
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        await conn.execute("LOCK TABLE limit_charges IN ACCESS SHARE MODE")
        for check in CHECKS:
            rows = await conn.fetch(check.sql)
            finding = (
                Finding(check.name, [str(r[0]) for r in rows[:examples]], len(rows))
                if rows else None
            )
            out.append((check.name, finding))
    return out


def report(results: list[tuple[str, Finding | None]]) -> tuple[str, bool]:
    lines = []
    ok = True
    for name, finding in results:
        if finding is None:
            lines.append(f"PASS  {name}")
        else:
            ok = False
            lines.append(f"FAIL  {name}: {finding.count} finding(s), e.g. "
                         + ", ".join(finding.examples))
    lines.append("verify: all invariants hold" if ok else "verify: INVARIANTS VIOLATED")
    return "\n".join(lines), ok
