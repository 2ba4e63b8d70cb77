"""The Redis fast path's layout against a real Redis: entries live at least the TTL, a batch
costs a handful of commands whatever its size, and nothing is ever invented."""

from __future__ import annotations

import time
import uuid

import redis
import redis.asyncio as aioredis

from service.adapters.redis_cache import RedisDedupCache
from tests.support import stack

TTL = 400  # buckets of 100 s


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cache_at(clock: Clock) -> RedisDedupCache:
    client = aioredis.Redis.from_url(stack.REDIS_URL, decode_responses=True)
    return RedisDedupCache(client, ttl_seconds=TTL, clock=clock)


async def test_entries_live_at_least_the_ttl_and_expire_after_it(live_stack) -> None:
    start = time.time() // 100 * 100 + 50  # now, mid-bucket (EXPIREAT must be in the future)
    clock = Clock(start)
    cache = cache_at(clock)
    txn = f"RC-{uuid.uuid4().hex}"
    try:
        assert await cache.set_many({txn: "fp-1"})
        assert await cache.get_many([txn, "nobody"]) == {txn: "fp-1"}
        clock.now += TTL - 1
        assert await cache.get_many([txn]) == {txn: "fp-1"}, "alive for the whole TTL"
        clock.now += 100 + 2  # past ttl + one bucket width: out of every live bucket
        assert await cache.get_many([txn]) == {}
        index = int(start // 100)
        expire_at = redis.Redis.from_url(stack.REDIS_URL).expiretime(cache.bucket_key(index))
        assert expire_at == (index + 1) * 100 + TTL
        await cache.forget([txn])
    finally:
        await cache.close()


async def test_a_batch_costs_a_few_commands_not_one_per_transaction(live_stack) -> None:
    clock = Clock(time.time())
    cache = cache_at(clock)
    sync = redis.Redis.from_url(stack.REDIS_URL)
    ids = [f"RC-{uuid.uuid4().hex}" for _ in range(500)]

    def calls() -> int:
        return sum(int(v["calls"]) for v in sync.info("commandstats").values())

    try:
        before = calls()
        assert await cache.set_many({t: "fp" for t in ids})
        found = await cache.get_many(ids)
        used = calls() - before - 1  # the INFO call itself
        assert found == {t: "fp" for t in ids}
        assert used <= 2 + len(cache.live_buckets()), used
        await cache.forget(ids)
        assert await cache.get_many(ids) == {}
    finally:
        await cache.close()


async def test_redis_down_is_a_miss_and_reported(live_stack) -> None:
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{stack.free_port()}/0",
                                     socket_connect_timeout=0.2, socket_timeout=0.2)
    cache = RedisDedupCache(client, ttl_seconds=TTL)
    assert await cache.get_many(["x"]) == {}
    assert not cache.up
    assert await cache.set_many({"x": "fp"}) is False
    await cache.close()
