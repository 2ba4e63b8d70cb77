"""The soak's sampler of the longest statement (``service/devtools/bench/activity.py``) on a
real database: a statement that runs for seconds is named with how long it ran, and
forgotten once taken."""

from __future__ import annotations

import asyncio

import asyncpg

from service.devtools.bench.activity import LongestStatement
from tests.support import stack


def test_a_statement_of_seconds_is_named_then_forgotten(env: stack.Env) -> None:
    sampler = LongestStatement(env.dsn, every=0.2)
    sampler.start()
    try:
        async def sleep_on_the_database() -> None:
            conn = await asyncpg.connect(env.dsn)
            try:
                await conn.execute("SELECT pg_sleep(1.5) /* the long one */")
            finally:
                await conn.close()

        asyncio.run(sleep_on_the_database())
        seconds, statement = sampler.take()
        assert 1.0 <= seconds <= 1.6, seconds
        assert "the long one" in statement
        assert sampler.take() == (0.0, "")  # (nothing ran since)
    finally:
        sampler.close()
