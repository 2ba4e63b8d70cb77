"""The lifecycle route ends the holds a batch names where it locked them (a TID scan of each),
whatever the planner believes of the holds: with statistics taken when few holds were
active and thousands active since, it read every active hold by their index for the
batch's tids and compared each one found with each of the batch's; believing the table
small, it read every hold. Either way, every batch, a cost that grows with the holds the
bank keeps rather than with the batch."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg

from service.adapters.postgres import PostgresStore
from tests.support import stack
from tests.support.factory import authorization


class ExplainedStore(PostgresStore):
    """Decides on a connection of its own with auto_explain on: every statement of the
    batch, nested ones too, with the rows each node read (``plans``)."""

    def __init__(self, pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
        super().__init__(pool)
        self._conn = conn
        self.plans: list[tuple[str, dict[str, Any]]] = []

    async def explain(self) -> None:
        await self._conn.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; "
            "SET auto_explain.log_nested_statements = on; SET auto_explain.log_analyze = on; "
            "SET auto_explain.log_timing = off; SET auto_explain.log_format = json; "
            "SET auto_explain.log_level = notice; SET client_min_messages = notice; "
            "SET plan_cache_mode = force_custom_plan; SET jit = off")
        self._conn.add_log_listener(self._keep)

    def _keep(self, _conn: Any, message: Any) -> None:
        text = message.message
        if "plan:" in text:
            plan = json.loads(text.split("plan:", 1)[1])
            self.plans.append((plan["Query Text"], plan["Plan"]))

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        return await self._conn.fetch(statement, *args)


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += _nodes(child)
    return found


def test_a_batch_ends_its_holds_where_it_locked_them_whatever_the_statistics(
        env: stack.Env) -> None:
    account = "PLAN-ACC"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000000.00", "EUR")]))
    run = uuid.uuid4().hex[:6]

    def holds(first: int, count: int) -> list[Any]:
        return [authorization(f"H-{run}-{n}", account, "1.00", kind="AUTHORIZATION")
                for n in range(first, first + count)]

    async def scenario() -> list[tuple[str, dict[str, Any]]]:
        store = await PostgresStore.connect(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("ALTER TABLE holds SET (autovacuum_enabled = false)")
            await stack.authorize_in_order(store, holds(0, 50))
            await conn.execute("ANALYZE holds")  # fifty active holds, as far as it knows
            for first in range(50, 4050, 1000):
                await stack.authorize_in_order(store, holds(first, 1000))
            explained = ExplainedStore(store._pool, conn)
            await explained.explain()
            clearings = [authorization(f"C-{run}-{n}", account, "1.00", kind="CLEARING",
                                       original=f"H-{run}-{n}") for n in range(3700, 4000)]
            results = await stack.authorize_in_order(explained, clearings)
            assert all(not r.forced for r in results)  # each ended a hold it found
            return explained.plans
        finally:
            await conn.close()
            await store.close()

    plans = asyncio.run(scenario())
    [update] = [plan for text, plan in plans if text.lstrip().startswith("UPDATE holds")]
    reads = [n for n in _nodes(update)
             if n.get("Relation Name") == "holds" and n["Node Type"] != "ModifyTable"]
    assert [n["Node Type"] for n in reads] == ["Tid Scan"], reads
    # each hold of the batch read once, none of the 3,750 other active holds
    assert reads[0]["Actual Rows"] * reads[0]["Actual Loops"] == 300, reads
