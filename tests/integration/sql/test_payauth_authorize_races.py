"""``payauth_authorize`` (sql/payauth_authorize.sql) against a batch deciding at the same
moment on another connection: an orphan reversal kept by one batch and its purchase decided
by another, interleaved exactly as a review found them losing the reversal's credit (the
purchase's batch reading the waiting orphans before it locked the account), and the same
race many times over through two stores, as two workers' batches meet."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import asyncpg

from service.adapters.postgres import PostgresStore
from service.domain.messages import Authorization, decode_authorization
from tests.support import stack
from tests.support.factory import auth_message, encode


def _auth(txn: str, account: str, amount: str, kind: str, original: str | None = None
          ) -> Authorization:
    return decode_authorization(encode(auth_message(
        txn, account_id=account, amount=amount, currency="EUR", authorization_type=kind,
        **({"original_transaction_id": original} if original else {}))))


class HeldOpenStore(PostgresStore):
    """Decides its batch inside a transaction it keeps open until ``release`` is set (the
    batch's account locks held, its writes not yet seen by anybody), then commits."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.decided = asyncio.Event()
        self.release = asyncio.Event()

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(statement, *args)
            self.decided.set()
            await self.release.wait()
            return rows


async def _waiting_for_a_lock(dsn: str, application_name: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND wait_event_type = 'Lock'", application_name))
    finally:
        await conn.close()


def test_an_orphan_kept_while_its_purchase_is_decided_elsewhere_is_applied(
        env: stack.Env) -> None:
    """1. A batch holds the reversal R1 of X1, not known yet: kept as a waiting orphan, the
    account locked, not committed. 2. Another batch holds X1 and waits for the account.
    3. R1 commits; X1 must be debited and credited back: 100.00, R1 applied."""
    account = f"RACE-{uuid.uuid4().hex[:6]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))

    async def scenario() -> None:
        holding = await HeldOpenStore.connect(env.dsn)
        waiting = await PostgresStore.connect(env.dsn)
        try:
            reversal = asyncio.create_task(holding.authorize(
                [_auth("R1", account, "10.00", "REVERSAL", "X1")], source_topic="t",
                source_partitions=[1], source_offsets=[0]))
            await asyncio.wait_for(holding.decided.wait(), 10)
            purchase = asyncio.create_task(waiting.authorize(
                [_auth("X1", account, "10.00", "PURCHASE")], source_topic="t",
                source_partitions=[2], source_offsets=[0]))
            for _ in range(200):  # until the purchase's batch waits for the account's lock
                if await _waiting_for_a_lock(env.dsn, "payauth-worker"):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the purchase's batch never waited for the account")
            holding.release.set()
            [orphan] = await reversal
            [decided] = await purchase
            assert orphan.orphan and decided.result == "APPROVED"
        finally:
            await holding.close()
            await waiting.close()

    asyncio.run(scenario())
    [row] = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1", account)
    [orphan] = stack.fetch(env.dsn, "SELECT state, applied FROM orphan_reversals "
                                    "WHERE txn_id = 'R1'")
    assert (orphan["state"], orphan["applied"]) == ("APPLIED", Decimal("10.00"))
    assert row["balance"] == Decimal("100.00")


def test_orphans_and_their_purchases_decided_at_once_by_two_stores(env: stack.Env) -> None:
    """Two stores (two workers' pools), one deciding reversals of purchases it has not seen,
    the other the purchases, 300 accounts each with one of each, in batches racing each
    other: every reversal ends applied, every balance back where it was."""
    accounts = [f"RB-{uuid.uuid4().hex[:6]}-{i}" for i in range(300)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "50.00", "EUR") for a in accounts]))

    async def scenario() -> None:
        reversals_store = await PostgresStore.connect(env.dsn)
        purchases_store = await PostgresStore.connect(env.dsn)
        try:
            for start in range(0, len(accounts), 30):
                chunk = accounts[start:start + 30]
                await asyncio.gather(
                    reversals_store.authorize(
                        [_auth(f"R-{a}", a, "20.00", "REVERSAL", f"X-{a}") for a in chunk],
                        source_topic="t", source_partitions=[1] * len(chunk),
                        source_offsets=list(range(len(chunk)))),
                    purchases_store.authorize(
                        [_auth(f"X-{a}", a, "20.00", "PURCHASE") for a in chunk],
                        source_topic="t", source_partitions=[2] * len(chunk),
                        source_offsets=list(range(len(chunk)))))
        finally:
            await reversals_store.close()
            await purchases_store.close()

    asyncio.run(scenario())
    waiting = stack.fetch(env.dsn, "SELECT txn_id FROM orphan_reversals WHERE state <> 'APPLIED'")
    off = stack.fetch(env.dsn, "SELECT account_id, balance FROM accounts "
                               "WHERE account_id = ANY($1::text[]) AND balance <> 50", accounts)
    assert waiting == [] and off == []
