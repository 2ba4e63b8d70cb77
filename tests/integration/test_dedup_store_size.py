"""What the worker's gauges ``payauth_dedup_records`` and ``payauth_dedup_store_bytes`` read
(``PostgresStore.dedup_store_size``): the rows of a table never analyzed counted exactly,
PostgreSQL's estimate once it is, and the bytes with the indexes, of every partition."""

from __future__ import annotations

import asyncio

from service.adapters.postgres import PostgresStore
from tests.support import stack
from tests.support.factory import authorization


def test_the_store_size_counts_a_young_table_then_reads_the_estimate(env: stack.Env) -> None:
    account = "SIZE-1"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))

    async def scenario() -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        store = await PostgresStore.connect(env.dsn)
        try:
            empty = await store.dedup_store_size()
            await stack.authorize_in_order(store, [
                authorization(f"SIZE-T{i}", account, "1.00") for i in range(40)])
            young = await store.dedup_store_size()
            async with store._pool.acquire() as conn:
                await conn.execute("ANALYZE processed_transactions")
            analyzed = await store.dedup_store_size()
            return empty, young, analyzed
        finally:
            await store.close()

    empty, young, analyzed = asyncio.run(scenario())
    [sizes] = stack.fetch(env.dsn, "SELECT (SELECT count(*) FROM processed_transactions) AS n,"
                                   " sum(pg_total_relation_size(relid)) AS bytes"
                                   " FROM pg_partition_tree('processed_transactions')")
    assert empty[0] == 0
    assert young[0] == sizes["n"] == 40  # never analyzed: counted
    assert analyzed == (40, sizes["bytes"])  # the statistics' estimate, exact for 40 rows
    assert sizes["bytes"] > empty[1] > 0  # the indexes count even when the table is empty
