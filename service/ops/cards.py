"""``payauth cards load FILE.csv`` and ``payauth cards status CARD_ID STATUS --reason TEXT``:
the cards the controls judge (docs/operations.md, "Card controls and spending limits").

``cards load``: columns ``card_id,account_id[,status,expires_on]`` (a header line with these
names is optional; ``expires_on`` a date, ``2028-03-31``: the card is valid through that
day). Every row is checked first, then, in one transaction (the accounts' locks taken
first, as every batch takes them), new cards are inserted and cards already there are left
as they are (a status changes only by ``cards status``, which
records who asked); a card of an account that does not exist loads nothing and names its
line.

``cards status``: one card's new status, with the reason and who asked (``--by``, by default
the operating-system user) kept in ``card_status_changes``. It takes the lock of the card's
account first, as every batch that decides for that account does, so the change applies
to every message decided after it commits and to none decided before.
"""

from __future__ import annotations

import asyncio
import getpass
import re
import sys
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import asyncpg

from service.config import Settings
from service.domain.vocabulary import IDENTIFIER_PATTERN, CardStatus
from service.ops import csv_file

COLUMNS = ("card_id", "account_id", "status", "expires_on")
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
STATUSES = tuple(s.value for s in CardStatus)


@dataclass(frozen=True)
class CardRow:
    line: int
    card_id: str
    account_id: str
    status: str
    expires_on: date | None


@dataclass
class LoadReport:
    new: list[str] = field(default_factory=list)
    already_there: list[str] = field(default_factory=list)

    def render(self) -> str:
        return (f"cards: {len(self.new)} new, {len(self.already_there)} already there (left "
                "unchanged: a status changes by `payauth cards status`), 0 rejected")


class CardRefused(Exception):
    """A status change that cannot be made (one line); nothing changed."""


def parse(text: str) -> list[CardRow]:
    """Every row, checked; raises ``csv_file.FileInvalid`` naming each bad line."""
    return csv_file.parse(text, COLUMNS, 2, _row, lambda row: row.card_id)


def _row(number: int, cells: list[str]) -> CardRow:
    card_id, account_id, status, expires = cells
    if not _IDENTIFIER.fullmatch(card_id):
        raise ValueError("card_id must be 1 to 64 printable ASCII characters, no spaces "
                         "(a token, never a card number)")
    if not _IDENTIFIER.fullmatch(account_id):
        raise ValueError("account_id must be 1 to 64 printable ASCII characters, no spaces")
    status = status or CardStatus.ACTIVE.value
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    try:
        expires_on = date.fromisoformat(expires) if expires else None
    except ValueError:
        raise ValueError("expires_on must be a date like 2028-03-31") from None
    return CardRow(number, card_id, account_id, status, expires_on)


async def load(dsn: str, rows: list[CardRow]) -> LoadReport:
    """Insert the new cards in one transaction; leave the others as they are. A card of an
    unknown account loads nothing (``csv_file.FileInvalid`` naming its line)."""
    report = LoadReport()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            # The accounts' locks, in the order every batch takes them (each card's insert
            # would take its own, row by row: payauth_controls_changed_behind_their_accounts).
            known = {r["account_id"] for r in await conn.fetch(
                "SELECT account_id FROM accounts WHERE account_id = ANY($1::text[]) "
                "ORDER BY account_id FOR UPDATE", list({r.account_id for r in rows}))}
            unknown = [f"line {r.line}: account_id {r.account_id} is no account"
                       for r in rows if r.account_id not in known]
            if unknown:
                raise csv_file.FileInvalid(unknown)
            inserted = await conn.fetch(
                """INSERT INTO cards (card_id, account_id, status, expires_on)
                   SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::date[])
                   ON CONFLICT (card_id) DO NOTHING
                   RETURNING card_id""",
                [r.card_id for r in rows], [r.account_id for r in rows],
                [r.status for r in rows], [r.expires_on for r in rows])
        new = {record["card_id"] for record in inserted}
        for r in rows:
            (report.new if r.card_id in new else report.already_there).append(r.card_id)
    finally:
        await conn.close()
    return report


def read(path: Path) -> list[CardRow]:
    return parse(path.read_text(encoding="utf-8-sig"))


async def change_status(dsn: str, card_id: str, status: str, reason: str,
                        by: str | None = None) -> str:
    """Set one card's status; returns what was done, in one line. Raises ``CardRefused``
    (nothing changed) for an unknown status or card, or an empty reason."""
    if status not in STATUSES:
        raise CardRefused(f"{status!r} is not a card status (one of {', '.join(STATUSES)})")
    if not reason.strip():
        raise CardRefused("--reason must say why")
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            account = await conn.fetchval(
                "SELECT account_id FROM cards WHERE card_id = $1", card_id)
            if account is None:
                raise CardRefused(f"no card {card_id!r}")
            # The account's lock, as a batch takes it: ordered with every decision for it.
            await conn.execute("SELECT 1 FROM accounts WHERE account_id = $1 FOR UPDATE",
                               account)
            old = await conn.fetchval(
                "SELECT status FROM cards WHERE card_id = $1 FOR UPDATE", card_id)
            if old == status:
                return f"cards: {card_id} is {status} already; nothing changed"
            await conn.execute(
                "UPDATE cards SET status = $2, updated_at = now() WHERE card_id = $1",
                card_id, status)
            await conn.execute(
                """INSERT INTO card_status_changes (card_id, old_status, new_status, reason,
                                                    changed_by)
                   VALUES ($1, $2, $3, $4, $5)""",
                card_id, old, status, reason.strip(), by or getpass.getuser())
    finally:
        await conn.close()
    return f"cards: {card_id} {old} -> {status} ({reason.strip()})"


def load_command(settings: Settings, path: str) -> int:
    """``payauth cards load FILE.csv``: exit 0 once loaded, 1 when nothing was."""
    rows = csv_file.read_or_report("cards", path, read)
    if rows is None:
        return 1
    try:
        print(asyncio.run(load(settings.database_url.get_secret_value(), rows)).render())
    except csv_file.FileInvalid as exc:
        return csv_file.report("cards", exc)
    return 0


def status_command(settings: Settings, card_id: str, status: str, reason: str,
                   by: str | None) -> int:
    """``payauth cards status``: exit 0 once set (or already so), 1 when refused."""
    try:
        print(asyncio.run(change_status(settings.database_url.get_secret_value(), card_id,
                                        status, reason, by)))
    except CardRefused as exc:
        print(f"cards status: {exc}; nothing changed", file=sys.stderr)
        return 1
    return 0
