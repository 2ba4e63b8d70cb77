"""A store whose batch stays decided but uncommitted until the test lets it go: the other
side of a two-connection test of ``payauth_authorize``, and the test's frame
(``command_while_a_batch_decides``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from service.adapters.postgres import PostgresStore
from service.domain.messages import Authorization
from tests.support import stack

T = TypeVar("T")


class HeldOpenStore(PostgresStore):
    """Decides its batch inside a transaction it keeps open until ``release`` is set (the
    batch's account locks held, its writes not yet seen by anybody), then commits."""

    def __init__(self, pool: asyncpg.Pool, limits_timezone: str = "UTC") -> None:
        super().__init__(pool, limits_timezone)
        self.decided = asyncio.Event()
        self.release = asyncio.Event()

    async def _call_authorize(self, statement: str, args: tuple[Any, ...]
                              ) -> list[asyncpg.Record]:
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(statement, *args)
            self.decided.set()
            await self.release.wait()
            return rows


def command_while_a_batch_decides(env: stack.Env, held: Authorization,
                                  command: Callable[[], Awaitable[T]],
                                  after: list[Authorization]) -> tuple[Any, T, list[Any]]:
    """``held`` decided by a batch that keeps its transaction open (its locks held: its
    account's, its records'); then ``command``, which must wait for one of them (asserted);
    then the batch commits, the command finishes, and ``after`` is decided in order by
    another store. The held batch's row, what the command said, the rows of ``after``."""

    async def scenario() -> tuple[Any, T, list[Any]]:
        holding = await HeldOpenStore.connect(env.dsn)
        other = await PostgresStore.connect(env.dsn)
        try:
            first = asyncio.create_task(holding.authorize(
                [held], source_topic="t", source_partitions=[1], source_offsets=[0]))
            await asyncio.wait_for(holding.decided.wait(), 10)
            running = asyncio.create_task(command())
            await stack.until_a_lock_is_awaited(env.dsn)  # the command waits for the batch
            assert not running.done()
            holding.release.set()
            [a] = await first
            said = await running
            return a, said, await stack.authorize_in_order(other, after)
        finally:
            await holding.close()
            await other.close()

    return asyncio.run(scenario())
