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
write (HSET, EXPIREAT), pipelined, and one script call to read (an HMGET per live bucket, of
the ids not found in a newer one): one round trip each way, whatever the batch size, instead
of a SET or GET per transaction.

Redis is optional: any Redis error marks it down (``payauth_redis_up 0``), the batch carries
on without it, and it is tried again after a short pause rather than on every batch.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.sentinel import Sentinel
from redis.connection import HiredisRespSerializer
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError
from redis.utils import HIREDIS_AVAILABLE

from service.core.ports import Refusals

log = structlog.get_logger(__name__)

BUCKET_PREFIX = "dedup:b:"

# Looks the ids up in the live buckets, newest first, asking each older bucket only for the
# ids still missing: one command and one reply per batch, with each id sent once (a pipeline
# of one HMGET per bucket sent every id five times, a tenth of a replay's time).
_LOOKUP = """
local found, missing = {}, {}
for i = 1, #ARGV do found[i] = false; missing[i] = i end
for _, bucket in ipairs(KEYS) do
  if #missing == 0 then break end
  local still = {}
  for first = 1, #missing, 1000 do
    local last = math.min(first + 999, #missing)
    local ids = {}
    for j = first, last do ids[#ids + 1] = ARGV[missing[j]] end
    local values = redis.call('HMGET', bucket, unpack(ids))
    for j = first, last do
      local value = values[j - first + 1]
      if value then found[missing[j]] = value else still[#still + 1] = missing[j] end
    end
  end
  missing = still
end
return found
"""


class _PackingInC:
    """Commands packed by hiredis (the reply parser already in use), as redis-py's sync
    connections do; its asyncio connections pack in Python (redis-py issue 4176), ten times
    slower for a batch's fast-path write (docs/benchmark.md, "Design figures")."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        packed: list[bytes] = self._packer.pack(*args)
        return packed


def packing_in_c(client: aioredis.Redis) -> aioredis.Redis:
    """``client``, whose connections (made from now on) pack commands with hiredis."""
    pool = client.connection_pool
    if HIREDIS_AVAILABLE and not issubclass(pool.connection_class, _PackingInC):
        base = pool.connection_class
        pool.connection_class = type(f"PackingInC{base.__name__}", (_PackingInC, base), {})
    return client


# The TLS settings a rediss:// URL may carry in its query (redis-py's own names).
TLS_OPTIONS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
               "ssl_check_hostname")


def tls_options(url: str) -> dict[str, Any]:
    """``ssl`` and the TLS settings of a ``rediss://`` URL's query (the CA to verify the
    server with, the client's certificate and key), as redis-py's keyword arguments; empty
    for ``redis://``. ``Settings`` refused the ones that would skip verification."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return {}
    options: dict[str, Any] = {"ssl": True}
    for name, value in parse_qsl(parts.query):
        if name in TLS_OPTIONS:
            options[name] = value
    if "ssl_check_hostname" in options:
        options["ssl_check_hostname"] = options["ssl_check_hostname"].lower() in (
            "1", "true", "yes")
    return options


def master_options(url: str) -> dict[str, Any]:
    """What a client of the master the Sentinels name takes from ``PAYAUTH_REDIS_URL`` (its
    host and port are the Sentinels' to give): user, password, database, TLS (its CA and
    client certificate too)."""
    parts = urlsplit(url)
    return {"username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else None,
            "db": int(parts.path.lstrip("/") or 0),  # a number: Settings checked it
            "ssl": False, **tls_options(url)}


def sentinel_options(url: str, password: str, timeout_seconds: float) -> dict[str, Any]:
    """The Sentinels' own connections: their password, the timeouts, and the URL's TLS
    settings (a TLS deployment runs its Sentinels over TLS with the same CA: redis-py copies
    nothing of the master's settings to them)."""
    return {"password": password or None, "socket_timeout": timeout_seconds,
            "socket_connect_timeout": timeout_seconds, **tls_options(url)}


def _refusal(exc: BaseException) -> bool:
    """Redis refused us (a bad password, a missing ACL, a failed TLS handshake), as opposed
    to being away. redis-py wraps the TLS error in a ConnectionError: look down the chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, AuthenticationError | NoPermissionError | ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RedisDedupCache:
    def __init__(
        self,
        client: aioredis.Redis,
        *,
        ttl_seconds: int,
        retry_after_seconds: float = 2.0,
        clock: Callable[[], float] = time.time,
        refusals: Refusals | None = None,
    ) -> None:
        self._client = client
        self._refusals = refusals
        self._ttl = ttl_seconds
        self._width = max(1, ttl_seconds // 4)
        self._retry_after = retry_after_seconds
        self._clock = clock
        self._down_since: float | None = None
        self._lookup = client.register_script(_LOOKUP)

    @classmethod
    def from_url(cls, url: str, *, ttl_seconds: int, timeout_seconds: float,
                 refusals: Refusals | None = None) -> RedisDedupCache:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            decode_responses=True,
            health_check_interval=30,
        )
        return cls(packing_in_c(client), ttl_seconds=ttl_seconds, refusals=refusals)

    @classmethod
    def from_sentinels(cls, sentinels: list[tuple[str, int]], master: str, url: str, *,
                       sentinel_password: str, ttl_seconds: int,
                       timeout_seconds: float,
                       refusals: Refusals | None = None) -> RedisDedupCache:
        """The master the Sentinels name, found again after a failover: redis-py's
        Sentinel connection pool asks them on every new connection, and a connection to a
        demoted master fails and is replaced. User, password, database and TLS settings
        from ``url``; the TLS settings go to the Sentinels' connections too."""
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it bare
            sentinels, socket_timeout=timeout_seconds,
            sentinel_kwargs=sentinel_options(url, sentinel_password, timeout_seconds),
        )
        client = sentinel.master_for(
            master, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
            decode_responses=True, health_check_interval=30, **master_options(url))
        return cls(packing_in_c(client), ttl_seconds=ttl_seconds, refusals=refusals)

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
        if self._refusals is not None and _refusal(exc):
            self._refusals.refused("redis", f"{type(exc).__name__}: {str(exc)[:200]}")

    def _mark_up(self) -> None:
        if self._down_since is not None:
            log.info("redis_up")
            if self._refusals is not None:
                self._refusals.accepted("redis")
        self._down_since = None

    # ------------------------------------------------------------- operations
    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]:
        """Fingerprints known for these transactions (one script call). Unknown ones
        are absent; Redis down means everything is absent."""
        if not txn_ids or self._skipping():
            return {}
        try:
            values = await self._lookup(keys=[self.bucket_key(i) for i in self.live_buckets()],
                                        args=list(txn_ids))
        except (RedisError, OSError) as exc:
            self._mark_down(exc)
            return {}
        self._mark_up()
        return {txn_id: value for txn_id, value in zip(txn_ids, values, strict=True)
                if value is not None}

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
