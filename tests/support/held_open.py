"""A store whose batch stays decided but uncommitted until the test lets it go: the other
side of a two-connection test of ``payauth_authorize``."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from service.adapters.postgres import PostgresStore


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
