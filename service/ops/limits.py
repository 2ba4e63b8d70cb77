"""``payauth limits load FILE.csv`` and ``payauth limits show --card ID | --account ID``: the
spending limits the controls count (docs/operations.md, "Card controls and spending
limits").

``limits load``: the columns of ``spending_limits``,
``limit_id,scope,scope_id,period,max_amount,max_count[,merchant_category]`` (a header line
with these names is optional; an empty maximum is none, one of the two is required). Every
row is checked first; a limit of a card or account that does not exist loads nothing and
names its line. A new limit_id is inserted; one already there gets the file's maximums (a
limit raised or lowered applies from the next decision; what was counted stays), but never
another scope, period or category: that is another limit, with another id (also when
another `limits load` inserted that id while this one ran: then nothing loads). One
transaction, which takes the locks of the accounts concerned first, as every batch that
decides for them does: the change applies to every message decided after it commits.

``limits show``: each limit of a card (and of its account), or of an account (and of its
cards), with its usage in the period now, in PAYAUTH_LIMITS_TIMEZONE.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import asyncpg

from service.config import Settings
from service.domain.money import PLAIN_DECIMAL
from service.domain.vocabulary import (
    IDENTIFIER_PATTERN,
    MAX_AMOUNT,
    LimitPeriod,
    LimitScope,
)
from service.ops import control_scopes, csv_file

COLUMNS = ("limit_id", "scope", "scope_id", "period", "max_amount", "max_count",
           "merchant_category")
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
_CATEGORY = re.compile(r"[0-9]{4}")


@dataclass(frozen=True)
class LimitRow:
    line: int
    limit_id: str
    scope: str
    scope_id: str
    period: str
    max_amount: Decimal | None
    max_count: int | None
    merchant_category: str | None


def parse(text: str) -> list[LimitRow]:
    """Every row, checked; raises ``csv_file.FileInvalid`` naming each bad line."""
    return csv_file.parse(text, COLUMNS, 6, _row, lambda row: row.limit_id)


def _row(number: int, cells: list[str]) -> LimitRow:
    limit_id, scope, scope_id, period, amount, count, category = cells
    if not _IDENTIFIER.fullmatch(limit_id):
        raise ValueError("limit_id must be 1 to 64 printable ASCII characters, no spaces")
    if scope not in {s.value for s in LimitScope}:
        raise ValueError(f"scope must be one of {', '.join(s.value for s in LimitScope)}")
    if not _IDENTIFIER.fullmatch(scope_id):
        raise ValueError("scope_id must name a card or an account")
    if period not in {p.value for p in LimitPeriod}:
        raise ValueError(f"period must be one of {', '.join(p.value for p in LimitPeriod)}")
    max_amount = None
    if amount:
        try:
            max_amount = Decimal(amount) if PLAIN_DECIMAL.fullmatch(amount) else None
        except InvalidOperation:
            max_amount = None
        if max_amount is None or max_amount > MAX_AMOUNT:
            raise ValueError('max_amount must be a plain decimal like "500.00", not negative')
    max_count = None
    if count:
        if not count.isdigit() or int(count) > 2**31 - 1:
            raise ValueError("max_count must be a whole number, not negative")
        max_count = int(count)
    if max_amount is None and max_count is None:
        raise ValueError("a limit needs max_amount, max_count or both")
    if category and not _CATEGORY.fullmatch(category):
        raise ValueError("merchant_category must be four digits (ISO 18245), or empty for all")
    return LimitRow(number, limit_id, scope, scope_id, period, max_amount, max_count,
                    category or None)


def read(path: Path) -> list[LimitRow]:
    return parse(path.read_text(encoding="utf-8-sig"))


async def load(dsn: str, rows: list[LimitRow]) -> str:
    """Insert the new limits and set the maximums of those already there, in one
    transaction; raises ``csv_file.FileInvalid`` (nothing loaded) for a limit of nothing
    or one that would change what an existing limit counts."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            owners, problems = await control_scopes.owners(conn, rows)
            existing = {e["limit_id"]: e for e in await conn.fetch(
                "SELECT * FROM spending_limits WHERE limit_id = ANY($1::text[])",
                [r.limit_id for r in rows])}
            for r in rows:
                e = existing.get(r.limit_id)
                if e is not None and (e["scope"], e["scope_id"], e["period"],
                                      e["merchant_category"]) != (
                        r.scope, r.scope_id, r.period, r.merchant_category):
                    category = e["merchant_category"] or "every category"
                    problems.append(f"line {r.line}: limit_id {r.limit_id} already counts "
                                    f"{e['scope']} {e['scope_id']} per {e['period']} in "
                                    f"{category}; another limit needs another id")
            if problems:
                raise csv_file.FileInvalid(problems)
            await control_scopes.lock_accounts(conn, (owners[(r.scope, r.scope_id)]
                                                      for r in rows))
            # A limit another command inserted since the check above (its transaction
            # still open then) is found here, once it commits: its maximums change only if
            # it counts what the file says; otherwise it is not written, and not returned.
            written = {w["limit_id"]: w["inserted"] for w in await conn.fetch(
                """INSERT INTO spending_limits AS l (limit_id, scope, scope_id, period,
                                                     max_amount, max_count, merchant_category)
                   SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
                                        $5::numeric[], $6::integer[], $7::text[])
                   ON CONFLICT (limit_id) DO UPDATE
                   SET max_amount = excluded.max_amount, max_count = excluded.max_count
                   WHERE (l.scope, l.scope_id, l.period, l.merchant_category)
                         IS NOT DISTINCT FROM (excluded.scope, excluded.scope_id,
                                               excluded.period, excluded.merchant_category)
                   RETURNING l.limit_id, l.xmax = 0 AS inserted""",
                [r.limit_id for r in rows], [r.scope for r in rows],
                [r.scope_id for r in rows], [r.period for r in rows],
                [r.max_amount for r in rows], [r.max_count for r in rows],
                [r.merchant_category for r in rows])}
            raced = [f"line {r.line}: limit_id {r.limit_id} was loaded meanwhile by another "
                     "command, counting something else; another limit needs another id"
                     for r in rows if r.limit_id not in written]
            if raced:
                raise csv_file.FileInvalid(raced)
    finally:
        await conn.close()
    changed = sum(1 for inserted in written.values() if not inserted)
    return f"limits: {len(rows) - changed} new, {changed} with new maximums, 0 rejected"


_SHOW = """
WITH scope AS (
    SELECT 'CARD' AS scope, c.card_id AS scope_id FROM cards c
     WHERE c.card_id = $1 OR c.account_id = $2
    UNION ALL
    SELECT 'ACCOUNT', a.account_id FROM accounts a
     WHERE a.account_id = $2 OR a.account_id = (SELECT account_id FROM cards WHERE card_id = $1)
)
SELECT l.limit_id, l.scope, l.scope_id, l.period, l.merchant_category, l.max_amount,
       l.max_count, p.start, coalesce(u.amount, 0) AS used_amount,
       coalesce(u.count, 0) AS used_count
  FROM scope s
  JOIN spending_limits l ON l.scope = s.scope AND l.scope_id = s.scope_id
 CROSS JOIN LATERAL (SELECT payauth_period_start(l.period, now(), $3) AS start) p
  LEFT JOIN limit_usage u ON u.limit_id = l.limit_id AND u.period_start = p.start
 ORDER BY l.scope DESC, l.scope_id, l.limit_id
"""


async def show(dsn: str, card_id: str | None, account_id: str | None, tz: str) -> list[str]:
    """One line per limit with its usage in the period now; raises ``LookupError`` for a
    card or account that does not exist."""
    conn = await asyncpg.connect(dsn)
    try:
        await control_scopes.require(conn, card_id, account_id)
        rows = await conn.fetch(_SHOW, card_id, account_id, tz)
    finally:
        await conn.close()
    if not rows:
        return ["limits: none"]
    lines = []
    for r in rows:
        period = r["period"] + (f" from {r['start']}" if r["start"] else "")
        parts = [f"{r['limit_id']}: {r['scope']} {r['scope_id']}, {period}"
                 + (f", category {r['merchant_category']}" if r["merchant_category"] else "")]
        if r["max_amount"] is not None:
            parts.append(f"amount {r['used_amount']} of {r['max_amount']}")
        if r["max_count"] is not None:
            parts.append(f"count {r['used_count']} of {r['max_count']}")
        if r["start"] is None:
            parts.append("(each message alone)")
        lines.append("; ".join(parts))
    return lines


def load_command(settings: Settings, path: str) -> int:
    """``payauth limits load FILE.csv``: exit 0 once loaded, 1 when nothing was."""
    rows = csv_file.read_or_report("limits", path, read)
    if rows is None:
        return 1
    try:
        print(asyncio.run(load(settings.database_url.get_secret_value(), rows)))
    except csv_file.FileInvalid as exc:
        return csv_file.report("limits", exc)
    return 0


def show_command(settings: Settings, card_id: str | None, account_id: str | None) -> int:
    """``payauth limits show``: exit 1 for a card or account that does not exist."""
    try:
        lines = asyncio.run(show(settings.database_url.get_secret_value(), card_id,
                                 account_id, settings.limits_timezone))
    except LookupError as exc:
        print(f"limits show: {exc.args[0]}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
