"""A batch's lookup of its keys on a period's young partition: for its first minute or so it
has never been analyzed, and with no statistics the planner read the whole partition for a
batch's keys, and compiled (JIT) the plan it costed so high, every batch: a batch took most
of a second instead of a few milliseconds. The worker's sessions probe each key by its
index there, and compile nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from service.adapters.pg_columns import joined
from service.adapters.postgres import _LOAD_STORED, PostgresStore
from tests.support import stack


def _scans(node: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every node of a plan: its type and the relation it reads."""
    found = [(node["Node Type"], node.get("Relation Name"))]
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


def test_the_lookup_probes_each_key_in_a_partition_never_analyzed(env: stack.Env) -> None:
    async def go() -> tuple[str, str, dict[str, Any]]:
        store = await PostgresStore.connect(env.dsn, min_size=1, max_size=1)
        try:
            async with store._pool.acquire() as conn:
                part = await conn.fetchval(  # the period under way's
                    "SELECT 'processed_transactions_' || to_char(payauth_dedup_period("
                    "payauth_dedup_clock()) AT TIME ZONE 'UTC', 'yyyymmdd\"_\"hh24miss')")
                await conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = false)")
                await conn.execute(
                    "INSERT INTO processed_transactions (txn_id, processed_at, result, "
                    "fingerprint, account_id, amount, currency, authorization_type) "
                    "SELECT 'YOUNG-' || g, now(), 'APPROVED', 'fp', 'ACC', 1, 'EUR', "
                    "'PURCHASE' FROM generate_series(1, 100000) AS g")
                never_analyzed = await conn.fetchval(
                    "SELECT reltuples < 0 FROM pg_class WHERE oid = $1::regclass", part)
                assert never_analyzed, "the partition was analyzed: nothing tested"
                keys = [f"YOUNG-{n}" for n in range(1, 500)] + [f"NEW-{n}" for n in range(500)]
                [[plan]] = await conn.fetch("EXPLAIN (ANALYZE, FORMAT JSON) " + _LOAD_STORED,
                                            joined(keys))
                return part, await conn.fetchval("SHOW jit"), json.loads(plan)[0]
        finally:
            await store.close()

    part, jit, plan = asyncio.run(go())
    scans = _scans(plan["Plan"])
    assert ("Seq Scan", part) not in scans, scans
    assert any(relation == part for _, relation in scans), scans
    assert "JIT" not in plan, plan["JIT"]
    assert jit == "off"
