"""The worker runs under the least-privilege role from the migrations, and what that role
must not do fails in PostgreSQL itself."""

from __future__ import annotations

import asyncio
import re
import uuid

import asyncpg
import pytest

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until


@pytest.fixture
def worker_login(env: stack.Env):  # type: ignore[no-untyped-def]
    """A login user that holds nothing but payauth_worker (password-less on the local,
    loopback-only stack; in production it has a password in the Secret)."""
    user = f"w_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(stack.PG_ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE ROLE "{user}" LOGIN IN ROLE payauth_worker'))
    yield user
    asyncio.run(admin(f'DROP ROLE IF EXISTS "{user}"'))


def test_worker_runs_under_the_least_privilege_role(env, spawn_worker, worker_login) -> None:
    dsn = env.dsn.replace("postgresql://", f"postgresql://{worker_login}@")
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    txns = [f"LP-{uuid.uuid4().hex[:10]}" for _ in range(5)]
    records = [(account, encode(auth_message(t, account_id=account))) for t in txns]
    stack.produce(env.input_topic, records, partition=0)
    worker = spawn_worker(env, PAYAUTH_DATABASE_URL=dsn)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    stack.produce(env.input_topic, records[:1], partition=0)  # the same message again
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.metrics()['payauth_messages_total{outcome="approved"}'] == 5
    wait_until(lambda: worker.metrics()['payauth_messages_total{outcome="duplicate"}'] == 1,
               20, "the redelivery counted")
    assert worker.terminate() == 0
    # What the worker writes besides decisions (receipts, duplicate sightings) and what the
    # operator's explain and shadow replay read all work under the worker role's grants.
    shown = payauth(env, "explain", txns[0], PAYAUTH_DATABASE_URL=dsn)
    assert shown.returncode == 0, shown.stderr
    assert "decision     APPROVED" in shown.stdout and "published    20" in shown.stdout
    assert "redelivery: 1 time(s)" in shown.stdout, shown.stdout
    shadowed = payauth(env, "replay", "--shadow", "--transactions", ",".join(txns),
                       PAYAUTH_DATABASE_URL=dsn)
    assert shadowed.returncode == 0, shadowed.stderr
    assert re.search(r"  unchanged +5\n", shadowed.stdout), shadowed.stdout

    async def as_worker() -> dict[str, str]:
        conn = await asyncpg.connect(dsn)
        outcomes = {}
        try:
            assert await conn.fetchval("SELECT current_user") == worker_login
            for name, sql in {
                "update ledger": "UPDATE ledger_entries SET amount = -1",
                "delete ledger": "DELETE FROM ledger_entries",
                "create table": "CREATE TABLE evil (x int)",
                "alter table": "ALTER TABLE accounts ADD COLUMN evil int",
                "drop table": "DROP TABLE processed_transactions",
                "open account": "INSERT INTO accounts (account_id, balance, opening_balance, "
                                "currency) VALUES ('X', 1, 1, 'EUR')",
                "rewrite opening balance": "UPDATE accounts SET opening_balance = 0",
                "truncate": "TRUNCATE ledger_entries",
            }.items():
                try:
                    await conn.execute(sql)
                    outcomes[name] = "allowed"
                except (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedTableError) as exc:
                    outcomes[name] = type(exc).__name__
            return outcomes
        finally:
            await conn.close()

    outcomes = asyncio.run(as_worker())
    assert all(v == "InsufficientPrivilegeError" for v in outcomes.values()), outcomes
