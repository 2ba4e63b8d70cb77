"""What the checker reads from the database, in one connection, to hold against the log."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

import asyncpg


async def database_state(dsn: str, txns: list[str], accounts: list[str]) -> dict[str, Any]:
    """What the database holds of the log's transactions and accounts: dedup records (with
    the card status each decision read), ledger entries, balances, holds and who ended them,
    applied orphan reversals, every spending limit's usage (summed over its periods), and
    how many connections sit idle in a transaction (a worker that left one open)."""
    conn = await asyncpg.connect(dsn)
    try:
        processed = {r["txn_id"]: r for r in await conn.fetch(
            "SELECT txn_id, result, decline_reason, fingerprint, source_partition, "
            "source_offset, processed_at, input_card_status FROM processed_transactions "
            "WHERE txn_id = ANY($1::text[])", txns)}
        ledger: dict[str, int] = defaultdict(int)
        amounts: dict[str, list[Decimal]] = defaultdict(list)
        for r in await conn.fetch("SELECT txn_id, amount FROM ledger_entries "
                                  "WHERE txn_id = ANY($1::text[])", txns):
            ledger[r["txn_id"]] += 1
            amounts[r["txn_id"]].append(r["amount"])
        balances = {r["account_id"]: r for r in await conn.fetch(
            "SELECT b.account_id, a.opening_balance, b.balance, b.held, b.available "
            "FROM account_balances b JOIN accounts a USING (account_id) "
            "WHERE b.account_id = ANY($1::text[])", accounts)}
        holds = {r["txn_id"]: r for r in await conn.fetch(
            "SELECT txn_id, account_id, amount, incremented, remaining, state, ended_by, "
            "released, placed_at, ended_at FROM holds WHERE account_id = ANY($1::text[])",
            accounts)}
        enders: dict[str, list[str]] = defaultdict(list)
        for r in await conn.fetch("SELECT txn_id, original_txn_id FROM lifecycle_messages "
                                  "WHERE ended_hold AND account_id = ANY($1::text[])",
                                  accounts):
            enders[r["original_txn_id"]].append(r["txn_id"])
        applied = {r["txn_id"]: r["applied"] for r in await conn.fetch(
            "SELECT txn_id, applied FROM orphan_reversals WHERE state = 'APPLIED' "
            "AND account_id = ANY($1::text[])", accounts)}
        usage = {r["limit_id"]: (r["amount"], r["count"]) for r in await conn.fetch(
            "SELECT limit_id, sum(amount) AS amount, sum(count) AS count FROM limit_usage "
            "GROUP BY limit_id")}
        idle = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%'")
        return {"processed": processed, "ledger": ledger, "amounts": amounts,
                "balances": balances, "holds": holds, "enders": enders, "applied": applied,
                "usage": usage, "idle": idle}
    finally:
        await conn.close()
