"""Accounts as the contract shapes them: a bank's loader that inserts only
``account_id, balance, currency, status`` works, ``payauth accounts load`` opens accounts from
a CSV file in one transaction and never changes an existing balance, and ``payauth verify``
holds afterwards."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from pathlib import Path

import asyncpg

from service.ops.verify import verify
from tests.support import stack
from tests.support.workers import payauth


def test_a_contract_shaped_insert_works_and_verify_holds(env) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute(
                "INSERT INTO accounts (account_id, balance, currency, status) "
                "VALUES ('C-1', 250.00, 'EUR', 'ACTIVE')")
            await conn.execute(
                "INSERT INTO accounts (account_id, balance, currency) VALUES ('C-2', 0, 'JPY')")
            rows = await conn.fetch("SELECT account_id, opening_balance, status FROM accounts "
                                    "ORDER BY account_id")
            assert [(r["account_id"], r["opening_balance"], r["status"]) for r in rows] == [
                ("C-1", Decimal("250.00"), "ACTIVE"), ("C-2", Decimal(0), "ACTIVE")]
        finally:
            await conn.close()

    asyncio.run(go())
    assert [name for name, finding in asyncio.run(verify(env.dsn)) if finding] == []


def test_accounts_load_opens_new_accounts_and_never_changes_a_balance(env,
                                                                     tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    asyncio.run(stack.seed_accounts(env.dsn, [(f"L-{run}-OLD", "10.00", "EUR")]))
    good = tmp_path / "accounts.csv"
    good.write_text("account_id,balance,currency,status\n"
                    f"L-{run}-A,100.00,EUR,ACTIVE\n"
                    f"L-{run}-B,5000,JPY\n"
                    f"L-{run}-C,0.125,KWD,BLOCKED\n"
                    f"L-{run}-OLD,999.00,EUR\n")
    done = payauth(env, "accounts", "load", str(good))
    assert done.returncode == 0, done.stderr
    assert "3 new, 1 already there" in done.stdout and "0 rejected" in done.stdout
    assert f"L-{run}-OLD" in done.stdout, "the differing existing account is named"
    balances = {r["account_id"]: (r["balance"], r["opening_balance"], r["status"])
                for r in stack.fetch(env.dsn, "SELECT * FROM accounts")}
    assert balances[f"L-{run}-OLD"][0] == Decimal("10.00"), "never changed by a load"
    assert balances[f"L-{run}-C"] == (Decimal("0.125"), Decimal("0.125"), "BLOCKED")
    assert balances[f"L-{run}-B"][2] == "ACTIVE"
    assert payauth(env, "verify").returncode == 0

    again = payauth(env, "accounts", "load", str(good))
    assert again.returncode == 0 and "0 new, 4 already there" in again.stdout


def test_a_bad_row_loads_nothing_and_names_its_line(env, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("account_id,balance,currency\n"
                   "B-1,10.00,EUR\n"
                   "B-2,-5.00,EUR\n"
                   "B-3,1.001,EUR\n"
                   "B-4,10.00,eur\n"
                   "B 5,10.00,EUR\n"
                   "B-1,3.00,EUR\n"
                   "B-7,10.00,EUR,FROZEN\n")
    done = payauth(env, "accounts", "load", str(bad))
    assert done.returncode == 1
    for line in (3, 4, 5, 6, 7, 8):
        assert f"line {line}:" in done.stderr, done.stderr
    assert "line 2:" not in done.stderr
    assert "nothing loaded" in done.stderr
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM accounts")[0]["n"] == 0
