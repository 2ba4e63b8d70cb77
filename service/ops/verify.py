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


CHECKS = (
    Check(
        "at most one ledger entry per transaction",
        "SELECT txn_id FROM ledger_entries GROUP BY txn_id HAVING count(*) > 1",
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
        "no negative (or NaN) balance",
        """SELECT account_id || ': ' || balance FROM accounts
            WHERE balance < 0 OR balance = 'NaN'""",
    ),
    Check(
        "every processed transaction has a result",
        """SELECT txn_id FROM processed_transactions
            WHERE result IS NULL OR result NOT IN ('APPROVED', 'DECLINED')
               OR (result = 'DECLINED' AND decline_reason IS NULL)""",
    ),
    Check(
        "every approved transaction has its ledger entry, with the same amount and account",
        """SELECT p.txn_id FROM processed_transactions p
             LEFT JOIN ledger_entries l ON l.txn_id = p.txn_id
            WHERE p.result = 'APPROVED'
              AND (l.txn_id IS NULL OR l.account_id <> p.account_id
                   OR abs(l.amount) <> p.amount OR l.currency <> p.currency)""",
    ),
    Check(
        "no ledger entry for a declined transaction",
        """SELECT p.txn_id FROM processed_transactions p
             JOIN ledger_entries l ON l.txn_id = p.txn_id
            WHERE p.result = 'DECLINED'""",
    ),
)


@dataclass(frozen=True)
class Finding:
    check: str
    examples: list[str]
    count: int


async def verify(dsn: str, *, examples: int = 5) -> list[tuple[str, Finding | None]]:
    conn = await asyncpg.connect(dsn)
    try:
        out: list[tuple[str, Finding | None]] = []
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            for check in CHECKS:
                rows = await conn.fetch(check.sql)
                finding = (
                    Finding(check.name, [str(r[0]) for r in rows[:examples]], len(rows))
                    if rows else None
                )
                out.append((check.name, finding))
        return out
    finally:
        await conn.close()


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
