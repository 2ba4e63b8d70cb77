"""The fast path's connections pack commands with hiredis: the same bytes as redis-py's own
Python packing, on whichever connection class the URL or the Sentinels chose."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.sentinel import SentinelManagedConnection

from service.adapters.redis_cache import RedisDedupCache, _PackingInC

COMMANDS = [
    ("HSET", "dedup:b:7", "TXN-1", "ab|3|tok", "TXN-ü", "€ 12.50", "7", "8"),
    ("EXPIREAT", "dedup:b:7", 1_798_000_000),
    ("EVALSHA", "0123abcd", 2, "dedup:b:7", "dedup:b:6", *[f"TXN-{i}" for i in range(3000)]),
    ("CONFIG GET", "maxmemory"),  # a command name of two words is sent as two arguments
    (b"HMGET", b"dedup:b:7", b"\x00\xff raw bytes"),
]


@pytest.mark.parametrize(("cache", "base"), [
    (RedisDedupCache.from_url("redis://127.0.0.1:1/0", ttl_seconds=60, timeout_seconds=1),
     Connection),
    (RedisDedupCache.from_url("rediss://127.0.0.1:1/0", ttl_seconds=60, timeout_seconds=1),
     SSLConnection),
    (RedisDedupCache.from_sentinels([("127.0.0.1", 1)], "payauth", "redis://127.0.0.1/0",
                                    sentinel_password="", ttl_seconds=60, timeout_seconds=1),
     SentinelManagedConnection),
], ids=["url", "tls", "sentinel"])
def test_commands_are_packed_in_c_as_redis_py_packs_them(cache: RedisDedupCache,
                                                         base: type[Connection]) -> None:
    made = cache._client.connection_pool.connection_class
    assert issubclass(made, _PackingInC) and issubclass(made, base)
    connection = made(**cache._client.connection_pool.connection_kwargs)
    for command in COMMANDS:
        assert b"".join(connection.pack_command(*command)) == \
            b"".join(base.pack_command(connection, *command))
    pipeline = [COMMANDS[0], COMMANDS[1]]
    assert b"".join(connection.pack_commands(pipeline)) == \
        b"".join(b"".join(base.pack_command(connection, *command)) for command in pipeline)
