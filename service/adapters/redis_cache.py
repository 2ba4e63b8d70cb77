"""The Redis fast path: transaction_id → payload fingerprint, kept for at least the TTL.

The life of an entry, and why it may only ever produce false negatives:

    PostgreSQL COMMIT ── result event acknowledged ── HSET (fast path) ── (≥ ttl) ── gone
                                                      ^ only from here on can a hit skip work

An entry written before COMMIT could outlive a rolled-back transaction and turn the next
redelivery into a silent loss; so it is written last. A miss, an expired entry, a flushed or
unreachable Redis only send the message on to PostgreSQL, which decides.

Layout: entries live in time buckets, ``dedup:b:{n}`` hashes (field = transaction_id, value =
fingerprint), bucket n covering [n·w, (n+1)·w) with w = ttl / 4. A bucket expires at
(n+1)·w + ttl, so every entry lives between ttl and ttl + w. A batch costs two commands to
write (HSET, EXPIREAT) and one HMGET per live bucket (five) to read, pipelined: one round trip
each way, whatever the batch size, instead of a SET per transaction.

Redis is optional: any Redis error marks it down (``payauth_redis_up 0``), the batch carries
on without it, and it is tried again after a short pause rather than on every batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

BUCKET_PREFIX = "dedup:b:"


class RedisDedupCache:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        ttl_seconds: int,
        retry_after_seconds: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._width = max(1, ttl_seconds // 4)
        self._retry_after = retry_after_seconds
        self._clock = clock
        self._down_since: float | None = None

    @classmethod
    def from_url(cls, url: str, *, ttl_seconds: int, timeout_seconds: float) -> RedisDedupCache:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            decode_responses=True,
            health_check_interval=30,
        )
        return cls(client, ttl_seconds=ttl_seconds)

    # ----------------------------------------------------------------- layout
    def bucket_key(self, index: int) -> str:
        return f"{BUCKET_PREFIX}{index}"

    def live_buckets(self) -> list[int]:
        """Buckets that may still hold an entry younger than the TTL, newest first."""
        now = self._clock()
        first, last = int((now - self._ttl) // self._width), int(now // self._width)
        return list(range(last, first - 1, -1))

    # ----------------------------------------------------------------- health
    @property
    def up(self) -> bool:
        return self._down_since is None

    def _skipping(self) -> bool:
        if self._down_since is None:
            return False
        return time.monotonic() - self._down_since < self._retry_after

    def _mark_down(self, exc: BaseException) -> None:
        if self._down_since is None:
            log.warning("redis_down", error=f"{type(exc).__name__}: {exc}")
        self._down_since = time.monotonic()

    def _mark_up(self) -> None:
        if self._down_since is not None:
            log.info("redis_up")
        self._down_since = None

    # ------------------------------------------------------------- operations
    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]:
        """Fingerprints known for these transactions (one pipelined round trip). Unknown ones
        are absent; Redis down means everything is absent."""
        if not txn_ids or self._skipping():
            return {}
        ids = list(txn_ids)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for index in self.live_buckets():
                    pipe.hmget(self.bucket_key(index), ids)
                answers = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return {}
        self._mark_up()
        found: dict[str, str] = {}
        for values in answers:  # newest bucket first: the latest entry wins
            for txn_id, value in zip(ids, values, strict=True):
                if value is not None and txn_id not in found:
                    found[txn_id] = value
        return found

    async def set_many(self, fingerprints: Mapping[str, str]) -> bool:
        """Remember decided transactions. Only call after COMMIT and after the result event was
        acknowledged. Returns False when Redis is down."""
        if not fingerprints or self._skipping():
            return False
        index = int(self._clock() // self._width)
        key = self.bucket_key(index)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping=dict(fingerprints))
                pipe.expireat(key, (index + 1) * self._width + self._ttl)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return False
        self._mark_up()
        return True

    async def forget(self, txn_ids: Sequence[str]) -> None:
        """Drop entries (operators and tests: simulate a lost or evicted cache entry)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for index in self.live_buckets():
                pipe.hdel(self.bucket_key(index), *txn_ids)
            await pipe.execute()

    async def ping(self) -> bool:
        try:
            await self._client.ping()  # type: ignore[misc]  # redis-py types it as sync|async
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return False
        self._mark_up()
        return True

    async def close(self) -> None:
        await self._client.aclose()
