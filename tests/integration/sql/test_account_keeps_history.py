"""An account that a ledger entry or a hold names keeps its row (migration 015,
sql/payauth_account_keeps_history.sql): what the two tables' foreign keys to accounts
refused, now refused by triggers on accounts, and the writers that write only for an account
they locked. Each rule on a real database; the two orders of a DELETE racing a batch on two
connections, interleaved at the account's lock."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from service.adapters.postgres import PostgresStore
from service.domain.dedup import StoredResult
from service.domain.messages import Authorization
from tests.support import stack
from tests.support.factory import authorization
from tests.support.workers import payauth

KEPT = "has ledger entries or holds: it is kept"


def _account(env: stack.Env, balance: str = "100.00") -> str:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, balance, "EUR")]))
    return account


def _purchase(account: str, amount: str = "10.00", kind: str = "PURCHASE") -> Authorization:
    return authorization(f"T-{uuid.uuid4().hex[:10]}", account, amount, kind)


def _decide(env: stack.Env, *batch: Authorization) -> list[StoredResult]:
    async def run() -> list[StoredResult]:
        store = await PostgresStore.connect(env.dsn)
        try:
            return await stack.authorize_in_order(store, list(batch))
        finally:
            await store.close()
    return asyncio.run(run())


def _refused(env: stack.Env, statement: str, *args: Any) -> str:
    with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
        stack.fetch(env.dsn, statement, *args)
    return str(caught.value)


def test_an_account_with_a_ledger_entry_or_a_hold_is_not_deleted_renamed_or_truncated(
        env: stack.Env) -> None:
    paid, held, idle = _account(env), _account(env), _account(env)
    _decide(env, _purchase(paid), _purchase(held, kind="AUTHORIZATION"))
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM holds WHERE account_id = $1",
                       held)[0]["n"] == 1
    for account in (paid, held):
        assert KEPT in _refused(env, "DELETE FROM accounts WHERE account_id = $1", account)
        assert KEPT in _refused(env, "UPDATE accounts SET account_id = account_id || '-X' "
                                     "WHERE account_id = $1", account)
    assert "cannot be truncated" in _refused(env, "TRUNCATE accounts")
    # An account nothing names goes; the authorize path's own UPDATEs are not held up.
    stack.fetch(env.dsn, "DELETE FROM accounts WHERE account_id = $1", idle)
    [again] = _decide(env, _purchase(paid, "5.00"))
    assert again.result.value == "APPROVED"
    assert stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1",
                       paid)[0]["balance"] == 85


def test_a_delete_waiting_for_a_batch_that_writes_the_account_is_refused(
        env: stack.Env) -> None:
    """The batch locks the account and posts to it, still open; a DELETE of the account
    waits for that lock; the batch commits: the DELETE, reading what committed, refuses."""
    account = _account(env)
    txn = _purchase(account)

    async def scenario() -> str:
        batch = await asyncpg.connect(env.dsn)
        deleter = await asyncpg.connect(env.dsn)
        try:
            tx = batch.transaction()
            await tx.start()
            await batch.execute("SELECT 1 FROM accounts WHERE account_id = $1 FOR UPDATE",
                                account)
            await batch.execute(
                "INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, "
                "created_at) VALUES ($1, $2, -10, 'EUR', 'PURCHASE', now())",
                txn.transaction_id, account)
            await batch.execute("UPDATE accounts SET balance = balance - 10 "
                                "WHERE account_id = $1", account)
            deleting = asyncio.create_task(
                deleter.execute("DELETE FROM accounts WHERE account_id = $1", account))
            await stack.until_a_lock_is_awaited(env.dsn)
            await tx.commit()
            with pytest.raises(asyncpg.ForeignKeyViolationError) as caught:
                await deleting
            return str(caught.value)
        finally:
            await batch.close()
            await deleter.close()

    assert KEPT in asyncio.run(scenario())
    assert stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1",
                       account)[0]["balance"] == 90


def test_a_batch_waiting_for_a_delete_that_commits_writes_nothing_for_the_account(
        env: stack.Env) -> None:
    """An account nothing names is deleted by a transaction still open; a batch for it waits
    for the account's lock; the DELETE commits: the batch finds no account (UNKNOWN_ACCOUNT)
    and writes no ledger entry and no hold naming it."""
    account = _account(env)
    purchase, hold = _purchase(account), _purchase(account, kind="AUTHORIZATION")

    async def scenario() -> list[StoredResult]:
        deleter = await asyncpg.connect(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            tx = deleter.transaction()
            await tx.start()
            await deleter.execute("DELETE FROM accounts WHERE account_id = $1", account)
            deciding = asyncio.create_task(stack.authorize_in_order(store, [purchase, hold]))
            await stack.until_a_lock_is_awaited(env.dsn)
            await tx.commit()
            return await deciding
        finally:
            await deleter.close()
            await store.close()

    rows = asyncio.run(scenario())
    assert [(r.result.value, r.decline_reason and r.decline_reason.value) for r in rows] \
        == [("DECLINED", "UNKNOWN_ACCOUNT")] * 2
    named = stack.fetch(env.dsn, """
        SELECT (SELECT count(*) FROM ledger_entries WHERE account_id = $1)
             + (SELECT count(*) FROM holds WHERE account_id = $1) AS n""", account)
    assert named[0]["n"] == 0
    assert payauth(env, "verify").returncode == 0
