"""The Redis fast path: ``dedup:{transaction_id}`` → payload fingerprint, with a TTL.

The life of a key, and why it may only ever produce false negatives:

    PostgreSQL COMMIT ── result event acknowledged ── SET dedup:{id} fp EX ttl ── (ttl) ── gone
                                                      ^ only from here on can a hit skip work

A key written before COMMIT could outlive a rolled-back transaction and turn the next
redelivery into a silent loss; so it is written last. A miss, an expired key, a flushed or
unreachable Redis only send the message on to PostgreSQL, which decides.

Redis is optional: any Redis error marks it down (``payauth_redis_up 0``), the batch carries
on without it, and it is tried again after a short pause rather than on every batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

KEY_PREFIX = "dedup:"


def dedup_key(transaction_id: str) -> str:
    return KEY_PREFIX + transaction_id


class RedisDedupCache:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        ttl_seconds: int,
        retry_after_seconds: float = 2.0,
    ) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._retry_after = retry_after_seconds
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

    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]:
        """Fingerprints known for these keys (one MGET). Missing keys are absent; Redis
        down means everything is absent."""
        if not txn_ids or self._skipping():
            return {}
        try:
            values = await self._client.mget([dedup_key(t) for t in txn_ids])
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return {}
        self._mark_up()
        return {t: v for t, v in zip(txn_ids, values, strict=True) if v is not None}

    async def set_many(self, fingerprints: Mapping[str, str]) -> bool:
        """Remember decided transactions (one pipelined round trip). Only call after COMMIT
        and after the result event was acknowledged. Returns False when Redis is down."""
        if not fingerprints or self._skipping():
            return False
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for txn_id, fingerprint in fingerprints.items():
                    pipe.set(dedup_key(txn_id), fingerprint, ex=self._ttl)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return False
        self._mark_up()
        return True

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
