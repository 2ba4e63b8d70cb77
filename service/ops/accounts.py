"""``payauth accounts load FILE.csv``: open accounts as the contract shapes them.

Columns ``account_id,balance,currency[,status]`` (a header line with these names is
optional). Every row is checked first; one bad row loads nothing and every bad row is named
with its line and reason. Then, in one transaction, new accounts are inserted and accounts
already there are left exactly as they are: their balance is never changed here. A balance
changes only through the ledger (an authorization), so ``payauth verify`` (balance = opening
balance + ledger) keeps holding; an opening balance is the balance at insert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

import asyncpg

from service.domain.money import (
    PLAIN_DECIMAL,
    UnknownCurrency,
    fits_minor_unit,
    minor_unit,
    quantum,
)
from service.domain.vocabulary import IDENTIFIER_PATTERN, MAX_AMOUNT, AccountStatus
from service.ops import csv_file

COLUMNS = ("account_id", "balance", "currency", "status")
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)


AccountsFileInvalid = csv_file.FileInvalid


@dataclass(frozen=True)
class AccountRow:
    line: int
    account_id: str
    balance: Decimal
    currency: str
    status: str


@dataclass
class LoadReport:
    new: list[str] = field(default_factory=list)
    already_there: list[str] = field(default_factory=list)
    # already there with another balance or currency than the file's: left unchanged
    differing: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"accounts: {len(self.new)} new, {len(self.already_there)} already there "
                 f"(left unchanged), 0 rejected"]
        if self.differing:
            lines.append(f"  {len(self.differing)} already there differ from the file (opening "
                         f"balance or currency), e.g. {', '.join(self.differing[:5])}: a balance "
                         "changes only through the ledger")
        return "\n".join(lines)


def parse(text: str) -> list[AccountRow]:
    """Every row, checked; raises ``AccountsFileInvalid`` naming each bad line."""
    return csv_file.parse(text, COLUMNS, 3, _row, lambda row: row.account_id)


def _row(number: int, cells: list[str]) -> AccountRow:
    account_id, balance_text, currency = cells[:3]
    status = cells[3] or AccountStatus.ACTIVE.value
    if not _IDENTIFIER.fullmatch(account_id):
        raise ValueError("account_id must be 1 to 64 printable ASCII characters, no spaces")
    try:
        allowed = minor_unit(currency)
    except UnknownCurrency as exc:
        raise ValueError(str(exc)) from None
    if not PLAIN_DECIMAL.fullmatch(balance_text):
        raise ValueError('balance must be a plain decimal like "125.50", not negative')
    try:
        balance = Decimal(balance_text)
    except InvalidOperation:
        raise ValueError("balance is not a number") from None
    if balance > MAX_AMOUNT:
        raise ValueError(f"balance must not exceed {MAX_AMOUNT}")
    if not fits_minor_unit(balance, quantum(currency)):
        raise ValueError(f"{currency} balances have at most {allowed} decimals")
    if status not in {s.value for s in AccountStatus}:
        raise ValueError(f"status must be one of {', '.join(s.value for s in AccountStatus)}")
    return AccountRow(number, account_id, balance, currency, status)


async def load(dsn: str, rows: list[AccountRow]) -> LoadReport:
    """Insert the new accounts in one transaction; leave the others as they are."""
    report = LoadReport()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            inserted = await conn.fetch(
                """INSERT INTO accounts (account_id, balance, currency, status)
                   SELECT * FROM unnest($1::text[], $2::numeric[], $3::text[], $4::text[])
                   ON CONFLICT (account_id) DO NOTHING
                   RETURNING account_id""",
                [r.account_id for r in rows], [r.balance for r in rows],
                [r.currency for r in rows], [r.status for r in rows])
            new = {record["account_id"] for record in inserted}
            existing = await conn.fetch(
                "SELECT account_id, opening_balance, currency FROM accounts "
                "WHERE account_id = ANY($1::text[])",
                [r.account_id for r in rows if r.account_id not in new])
        stored = {e["account_id"]: e for e in existing}
        for r in rows:
            if r.account_id in new:
                report.new.append(r.account_id)
                continue
            report.already_there.append(r.account_id)
            e = stored.get(r.account_id)
            if e is not None and (e["opening_balance"] != r.balance
                                  or e["currency"] != r.currency):
                report.differing.append(r.account_id)
    finally:
        await conn.close()
    return report


def read(path: Path) -> list[AccountRow]:
    return parse(path.read_text(encoding="utf-8-sig"))
