"""What the card controls' files share (``limits.py``, ``blocks.py``): a row's scope (a card
or an account, by its id) and the account it belongs to, and those accounts' locks taken in
the order every batch takes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import asyncpg

_OWNERS = """
SELECT 'ACCOUNT' AS scope, account_id AS scope_id, account_id
  FROM accounts WHERE account_id = ANY($1::text[])
UNION ALL
SELECT 'CARD', card_id, account_id FROM cards WHERE card_id = ANY($1::text[])
"""


class ScopedRow(Protocol):
    @property
    def line(self) -> int: ...
    @property
    def scope(self) -> str: ...
    @property
    def scope_id(self) -> str: ...


async def owners(conn: asyncpg.Connection, rows: Sequence[ScopedRow]
                 ) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The account of each row's (scope, scope_id) that exists, and a problem naming the
    line of each row whose card or account does not."""
    found = {(r["scope"], r["scope_id"]): r["account_id"] for r in await conn.fetch(
        _OWNERS, list({r.scope_id for r in rows}))}
    return found, [f"line {r.line}: {r.scope.lower()} {r.scope_id} does not exist"
                   for r in rows if (r.scope, r.scope_id) not in found]


async def lock_accounts(conn: asyncpg.Connection, accounts: Iterable[str]) -> None:
    """The accounts' locks, in the order every batch takes them (each row written would
    take its own, row by row: payauth_controls_changed_behind_their_accounts)."""
    await conn.execute("SELECT 1 FROM accounts WHERE account_id = ANY($1::text[]) "
                       "ORDER BY account_id FOR UPDATE", sorted(set(accounts)))


async def require(conn: asyncpg.Connection, card_id: str | None,
                  account_id: str | None) -> None:
    """Raise ``LookupError`` for a card (or, without one, an account) that does not exist."""
    found = await conn.fetchval(
        "SELECT count(*) FROM cards WHERE card_id = $1" if card_id else
        "SELECT count(*) FROM accounts WHERE account_id = $1", card_id or account_id)
    if not found:
        raise LookupError(f"no {'card' if card_id else 'account'} {card_id or account_id!r}")
