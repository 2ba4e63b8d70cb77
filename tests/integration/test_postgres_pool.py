"""The store's pool takes a connection back without a round trip of its own (asyncpg's
default resets the session on every release: three or four per batch, on the batch's path),
and still never lends a connection with a transaction left open."""

from __future__ import annotations

import asyncio

from service.adapters.postgres import PostgresStore
from tests.support import stack


def test_a_connection_goes_back_to_the_pool_without_a_statement(env: stack.Env) -> None:
    async def go() -> tuple[list[str], bool]:
        store = await PostgresStore.connect(env.dsn, min_size=1, max_size=1)
        sent: list[str] = []
        try:
            async with store._pool.acquire() as conn:  # the pool's one connection
                conn.add_query_logger(lambda record: sent.append(record.query))
                await conn.execute("BEGIN")  # left open, as a batch cut short might leave it
            await store.load_stored(["no-such-transaction"])
            async with store._pool.acquire() as conn:
                left_open = conn.is_in_transaction()
            await asyncio.sleep(0)  # query loggers are called soon, not at once
        finally:
            await store.close()
        return sent, left_open

    sent, left_open = asyncio.run(go())
    assert not left_open, "the open transaction was rolled back when the connection went back"
    statements = [" ".join(q.split()) for q in sent]
    assert statements[0] == "BEGIN" and statements[1] == "ROLLBACK"
    assert not any("RESET ALL" in s or "UNLISTEN" in s for s in statements), statements
    assert len(statements) == 3, statements  # BEGIN, its rollback, the lookup: nothing else
