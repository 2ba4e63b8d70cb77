"""``payauth blocks load FILE.csv``, ``payauth blocks lift FILE.csv`` and ``payauth blocks
show --card ID | --account ID``: the merchant categories and countries blocked for a card or
an account (docs/operations.md, "Card controls and spending limits").

The files have the columns of ``card_blocks``, ``scope,scope_id,kind,value`` (a header line
with these names is optional): a scope ``CARD`` or ``ACCOUNT``, the card's or account's id, a
kind ``CATEGORY`` (its value four digits, ISO 18245) or ``COUNTRY`` (two capital letters,
ISO 3166-1 alpha-2, as messages carry ``merchant_country``). Every row is checked first; a
block of a card or an account that does not exist loads nothing and names its line. ``load``
adds the blocks not there yet, ``lift`` deletes those there; either in one transaction,
which takes the locks of the accounts concerned first, as every batch that decides for them
does: the change applies to every message decided after it commits.

``show``: the blocks that judge a card's messages (its own and its account's), or an
account's and its cards'.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from service.config import Settings
from service.domain.vocabulary import IDENTIFIER_PATTERN
from service.ops import control_scopes, csv_file

COLUMNS = ("scope", "scope_id", "kind", "value")
SCOPES = ("CARD", "ACCOUNT")
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
_VALUES = {"CATEGORY": (re.compile(r"[0-9]{4}"), "four digits (ISO 18245), like 7995"),
           "COUNTRY": (re.compile(r"[A-Z]{2}"), "two capital letters (ISO 3166-1), like KP")}


@dataclass(frozen=True)
class BlockRow:
    line: int
    scope: str
    scope_id: str
    kind: str
    value: str

    def render(self) -> str:
        return f"{self.scope} {self.scope_id} {self.kind} {self.value}"


def parse(text: str) -> list[BlockRow]:
    """Every row, checked; raises ``csv_file.FileInvalid`` naming each bad line."""
    return csv_file.parse(text, COLUMNS, 4, _row, BlockRow.render)


def _row(number: int, cells: list[str]) -> BlockRow:
    scope, scope_id, kind, value = cells
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    if not _IDENTIFIER.fullmatch(scope_id):
        raise ValueError("scope_id must name a card or an account")
    if kind not in _VALUES:
        raise ValueError(f"kind must be one of {', '.join(_VALUES)}")
    pattern, spelled = _VALUES[kind]
    if not pattern.fullmatch(value):
        raise ValueError(f"a {kind.lower()} is {spelled}")
    return BlockRow(number, scope, scope_id, kind, value)


def read(path: Path) -> list[BlockRow]:
    return parse(path.read_text(encoding="utf-8-sig"))


async def change(dsn: str, rows: list[BlockRow], *, lift: bool) -> str:
    """Add the blocks (or, ``lift``, delete them) in one transaction; raises
    ``csv_file.FileInvalid`` (nothing changed) for a block of a card or account that does not
    exist."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            owners, problems = await control_scopes.owners(conn, rows)
            if problems:
                raise csv_file.FileInvalid(problems)
            await control_scopes.lock_accounts(conn, (owners[(r.scope, r.scope_id)]
                                                      for r in rows))
            columns = ([r.scope for r in rows], [r.scope_id for r in rows],
                       [r.kind for r in rows], [r.value for r in rows])
            if lift:
                changed = await conn.fetch(
                    """DELETE FROM card_blocks b
                        USING unnest($1::text[], $2::text[], $3::text[], $4::text[])
                              AS f(scope, scope_id, kind, value)
                        WHERE (b.scope, b.scope_id, b.kind, b.value)
                              = (f.scope, f.scope_id, f.kind, f.value)
                    RETURNING 1""", *columns)
            else:
                changed = await conn.fetch(
                    """INSERT INTO card_blocks (scope, scope_id, kind, value)
                       SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                       ON CONFLICT DO NOTHING
                       RETURNING 1""", *columns)
    finally:
        await conn.close()
    if lift:
        return f"blocks: {len(changed)} lifted, {len(rows) - len(changed)} were not there"
    return f"blocks: {len(changed)} new, {len(rows) - len(changed)} already there"


_SHOW = """
SELECT b.scope, b.scope_id, b.kind, b.value FROM card_blocks b
 WHERE (b.scope = 'CARD' AND b.scope_id IN (SELECT c.card_id FROM cards c
                                             WHERE c.card_id = $1::text
                                                OR c.account_id = $2::text))
    OR (b.scope = 'ACCOUNT' AND b.scope_id IN (
            SELECT $2::text UNION ALL SELECT c.account_id FROM cards c
                                       WHERE c.card_id = $1::text))
 ORDER BY b.scope DESC, b.scope_id, b.kind, b.value
"""


async def show(dsn: str, card_id: str | None, account_id: str | None) -> list[str]:
    """One line per block; raises ``LookupError`` for a card or account that does not
    exist."""
    conn = await asyncpg.connect(dsn)
    try:
        await control_scopes.require(conn, card_id, account_id)
        rows = await conn.fetch(_SHOW, card_id, account_id)
    finally:
        await conn.close()
    return [f"{r['scope']} {r['scope_id']}: {r['kind']} {r['value']}" for r in rows] \
        or ["blocks: none"]


def change_command(settings: Settings, path: str, *, lift: bool) -> int:
    """``payauth blocks load|lift FILE.csv``: exit 0 once done, 1 when nothing changed."""
    rows = csv_file.read_or_report("blocks", path, read)
    if rows is None:
        return 1
    try:
        print(asyncio.run(change(settings.database_url.get_secret_value(), rows, lift=lift)))
    except csv_file.FileInvalid as exc:
        return csv_file.report("blocks", exc)
    return 0


def show_command(settings: Settings, card_id: str | None, account_id: str | None) -> int:
    """``payauth blocks show``: exit 1 for a card or account that does not exist."""
    try:
        lines = asyncio.run(show(settings.database_url.get_secret_value(), card_id,
                                 account_id))
    except LookupError as exc:
        print(f"blocks show: {exc.args[0]}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
