"""The lifecycle's two SQL paths give the same answers: ``payauth_lifecycle`` decides a batch
of the common path set-based (migration 012) and hands any other batch whole to the loop,
``payauth_lifecycle_each`` (migration 011). Each batch here is decided by one, its results
and every row it wrote read, rolled back, then by the other on the same state; the two must
agree, and the common-path batches must not have taken the loop (the function statistics of
the transaction say which ran)."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg

from tests.support import stack

CALL = """SELECT * FROM {fn}($1::text[], $2::text[], $3::numeric[], $4::text[], $5::text[],
                            $6::text[], $7::text[], $8::text[], $9::integer[], $10::bigint[],
                            $11, $12, $13, $14::text[])"""
# The loop's calls as counted so far (track_functions): read before and after a call.
LOOP_CALLS = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
              "WHERE funcname = 'payauth_lifecycle_each'")
# What each path wrote, without what differs between two transactions by nature (serial ids,
# the database's clock): compared row for row.
SNAPSHOT = {
    "holds": "SELECT txn_id, account_id, kind, amount, remaining, state, ended_at IS NULL AS "
             "active, ended_by, released FROM holds ORDER BY txn_id",
    "processed": "SELECT txn_id, result, decline_reason, amount_applied, forced, orphan, "
                 "original_txn_id, input_balance, input_status, input_currency, rule_version "
                 "FROM processed_transactions ORDER BY txn_id",
    "lifecycle": "SELECT txn_id, kind, result, decline_reason, amount_applied, forced, orphan, "
                 "ended_hold, original_txn_id FROM lifecycle_messages ORDER BY txn_id",
    "ledger": "SELECT txn_id, account_id, amount, type FROM ledger_entries ORDER BY entry_id",
    "orphans": "SELECT txn_id, state, applied FROM orphan_reversals ORDER BY txn_id",
    "accounts": "SELECT account_id, balance, held FROM accounts ORDER BY account_id",
}
Msg = tuple[str, str, str, str, str | None, str]  # txn, account, kind, amount, original, cur
ACCOUNTS = [("P-RICH", "100000.00", "ACTIVE"), ("P-POOR", "50.00", "ACTIVE"),
            ("P-BLOCKED", "1000.00", "BLOCKED")]


class Stream:
    """Random batches whose every REVERSAL and CLEARING names a hold placed before it (the
    common path), with the decisions that path must still make: declines for funds and
    status, capped and full reversals, a reversal or clearing after the hold's end,
    clearings over and under the hold and forced ones, advices past the balance."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.holds: dict[str, str] = {}  # placed (approved for sure) -> its account
        self.n = 0

    def _txn(self) -> str:
        self.n += 1
        return f"P-{self.n:05d}"

    def message(self) -> Msg:
        rng = self.rng
        roll = rng.random()
        if self.holds and roll < 0.45:
            original = rng.choice(sorted(self.holds))
            account = self.holds[original]
            if rng.random() < 0.6:
                return (self._txn(), account, "REVERSAL", rng.choice(["5.00", "20.00", "90.00"]),
                        original, "EUR")
            return self._txn(), account, "CLEARING", rng.choice(["10.00", "60.00"]), original, "EUR"
        account = rng.choice(ACCOUNTS)[0]
        txn = self._txn()
        if roll < 0.65:
            kind = "ADVICE" if rng.random() < 0.3 or account != "P-RICH" else "AUTHORIZATION"
            self.holds[txn] = account  # an advice is always placed; so is a hold on P-RICH
            return txn, account, kind, rng.choice(["30.00", "70.00", "400.00"]), None, "EUR"
        if roll < 0.72:
            return txn, account, "AUTHORIZATION", "5000.00", None, "EUR"  # declined but on P-RICH
        if roll < 0.8:
            return txn, account, "CLEARING", "15.00", None, "EUR"  # forced
        if roll < 0.9:  # declined: an unknown account, another currency
            return (txn, rng.choice(["P-NOBODY", account]),
                    rng.choice(["PURCHASE", "REFUND", "AUTHORIZATION"]), "5.00", None, "USD")
        return txn, account, rng.choice(["PURCHASE", "REFUND"]), rng.choice(
            ["25.00", "800.00"]), None, "EUR"


def _args(batch: list[Msg]) -> list[Any]:
    n = len(batch)
    return [[b[0] for b in batch], [b[1] for b in batch], [Decimal(b[3]) for b in batch],
            [b[5] for b in batch], [b[2] for b in batch], [f"fp-{b[0]}" for b in batch],
            [f"c-{b[0]}" for b in batch], [f"m-{b[0]}" for b in batch], [0] * n,
            list(range(n)), datetime(2026, 12, 1, tzinfo=UTC), "t", uuid.uuid4(),
            [b[4] for b in batch]]


async def _decide(conn: asyncpg.Connection, fn: str, args: list[Any]
                  ) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]], int]:
    """``fn`` on ``args`` inside a transaction the caller ends: its answer, the tables after
    it, and how many times the loop ran."""
    before = await conn.fetchval(LOOP_CALLS)
    rows = await conn.fetch(CALL.format(fn=fn), *args)
    loops = await conn.fetchval(LOOP_CALLS) - before - (fn == "payauth_lifecycle_each")
    tables = {name: [tuple(r) for r in await conn.fetch(sql)] for name, sql in SNAPSHOT.items()}
    return [tuple(r) for r in rows], tables, int(loops)


async def _both(conn: asyncpg.Connection, batch: list[Msg]) -> int:
    """Decides ``batch`` both ways, asserts they agree, keeps the set-based one's effects;
    returns how many times the set-based call fell back to the loop."""
    args = _args(batch)
    tx = conn.transaction()
    await tx.start()
    by_loop = await _decide(conn, "payauth_lifecycle_each", args)
    await tx.rollback()
    tx = conn.transaction()
    await tx.start()
    set_based = await _decide(conn, "payauth_lifecycle", args)
    await tx.commit()
    assert set_based[0] == by_loop[0], batch
    assert set_based[1] == by_loop[1], batch
    return set_based[2]


def test_the_set_based_path_decides_as_the_loop(env: stack.Env) -> None:
    async def scenario() -> None:
        for account, balance, status in ACCOUNTS:
            await stack.seed_accounts(env.dsn, [(account, balance, "EUR")], status=status)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET track_functions = 'pl'")
            stream = Stream(seed=12)
            fell_back = 0
            results: set[tuple[Any, ...]] = set()
            for size in [1, 3, 20, 60, 150] * 3:
                batch = [stream.message() for _ in range(size)]
                fell_back += await _both(conn, batch)
                results |= {(r["result"], r["decline_reason"]) for r in await conn.fetch(
                    "SELECT result, decline_reason FROM processed_transactions")}
            assert fell_back == 0  # every batch of the common path stayed on it
            assert {("APPROVED", None), ("DECLINED", "INSUFFICIENT_FUNDS"),
                    ("DECLINED", "ACCOUNT_BLOCKED"), ("DECLINED", "UNKNOWN_ACCOUNT"),
                    ("DECLINED", "CURRENCY_MISMATCH")} <= results
            states = {r["state"] for r in await conn.fetch("SELECT state FROM holds")}
            assert {"ACTIVE", "REVERSED", "CLEARED"} <= states

            # Off the common path, the set-based call hands the batch whole to the loop.
            off_path = [
                [("P-X1", "P-RICH", "REVERSAL", "5.00", "P-NOT-YET", "EUR")],  # an orphan
                [("P-X2", "P-NOBODY", "CLEARING", "5.00", None, "EUR")],  # no account
                [("P-X5", "P-RICH", "ADVICE", "5.00", None, "USD")],  # another currency
                [("P-X3", "P-RICH", "AUTHORIZATION", "1.00", None, "EUR"),
                 ("P-X4", "P-POOR", "REVERSAL", "1.00", "P-X3", "EUR")],  # another's hold
            ]
            for batch in off_path:
                assert await _both(conn, batch) == 1, batch
        finally:
            await conn.close()

    asyncio.run(scenario())
