"""The identifier rule each table keeps itself (migrations 019 and 020): an account_id or a
transaction_id is 1 to 64 characters of printable ASCII, no space. The same rule as the
message schema's; each boundary on a real database, on every table that keeps it, and the
checks validated (a database's rows all met them when they were put in)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.support import stack

ACCEPTED = ["a", "!", "~", "A" * 64, "pgb-0-1234-5", "".join(chr(c) for c in range(33, 97))]
REFUSED = ["", "A" * 65, "a b", "café", "tab\there", "del\x7f", "nul-less\x01"]

_INSERT = {
    "accounts": "INSERT INTO accounts (account_id, balance, currency) VALUES ($1, 0, 'EUR')",
    "holds": "INSERT INTO holds (txn_id, account_id, currency, kind, amount, remaining, state) "
             "VALUES ($1, 'ACC', 'EUR', 'AUTHORIZATION', 1, 1, 'ACTIVE')",
    "processed_transactions":
        "INSERT INTO processed_transactions (txn_id, processed_at, result, fingerprint, "
        "account_id, amount, currency, authorization_type) "
        "VALUES ($1, now(), 'APPROVED', 'fp', 'ACC', 1, 'EUR', 'PURCHASE')",
}


def _inserted(env: stack.Env, table: str, identifier: str) -> bool:
    """Whether ``table`` took a row of ``identifier`` (rolled back either way)."""
    async def go() -> bool:
        conn = await asyncpg.connect(env.dsn)
        try:
            async with conn.transaction():
                try:
                    await conn.execute(_INSERT[table], identifier)
                except asyncpg.CheckViolationError:
                    return False
                raise _RollBack
        except _RollBack:
            return True
        finally:
            await conn.close()

    return asyncio.run(go())


class _RollBack(Exception):
    pass


@pytest.mark.parametrize("table", sorted(_INSERT))
def test_each_table_takes_every_identifier_the_rule_allows(env: stack.Env, table: str) -> None:
    assert {i: _inserted(env, table, i) for i in ACCEPTED} == dict.fromkeys(ACCEPTED, True)


@pytest.mark.parametrize("table", sorted(_INSERT))
def test_each_table_refuses_every_identifier_the_rule_refuses(env: stack.Env,
                                                              table: str) -> None:
    assert {i: _inserted(env, table, i) for i in REFUSED} == dict.fromkeys(REFUSED, False)


def test_the_checks_are_validated_on_every_table_and_partition(env: stack.Env) -> None:
    rows = stack.fetch(env.dsn, "SELECT conrelid::regclass::text AS rel, convalidated "
                                "FROM pg_constraint WHERE conname IN "
                                "('accounts_account_id_check', 'holds_txn_id_check', "
                                "'processed_transactions_txn_id_check')")
    relations = {r["rel"] for r in rows}
    assert {"accounts", "holds", "processed_transactions",
            "processed_transactions_default"} <= relations
    assert all(r["convalidated"] for r in rows), rows
