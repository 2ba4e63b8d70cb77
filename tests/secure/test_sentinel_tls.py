"""Redis behind Sentinels over TLS, with the secured stack's CA: the fast path finds the
master through Sentinels that speak only TLS and reaches the master over TLS with its client
certificate, all from the TLS settings of ``PAYAUTH_REDIS_URL``. The control: a Sentinel
client without those settings (what the worker had before) cannot even ask."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from service.adapters.redis_cache import RedisDedupCache
from tests.secure.conftest import TLS
from tests.support import stack

MASTER = "payauth-tls"


def _tls(port: int) -> list[str]:
    return ["port 0", f"tls-port {port}", f"tls-cert-file {TLS / 'redis.pem'}",
            f"tls-key-file {TLS / 'redis.key'}", f"tls-ca-cert-file {TLS / 'ca.pem'}",
            "tls-auth-clients yes", "tls-replication yes", "bind 127.0.0.1"]


def _start(config: Path, lines: list[str], port: int, *mode: str) -> subprocess.Popen[bytes]:
    config.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(["redis-server", str(config), *mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not stack.port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"redis-server on {port} did not start")
        time.sleep(0.05)
    return proc


@pytest.fixture
def tls_sentinel(live_stack: None, tmp_path: Path):  # type: ignore[no-untyped-def]
    master_port, sentinel_port = stack.free_port(), stack.free_port()
    master = _start(tmp_path / "master.conf",
                    [*_tls(master_port), f"dir {tmp_path}", 'save ""', "appendonly no"],
                    master_port)
    # Host names, not addresses: the certificates name DNS:localhost, and the client checks.
    sentinel = _start(tmp_path / "sentinel.conf",
                      [*_tls(sentinel_port), f"dir {tmp_path}",
                       "sentinel resolve-hostnames yes", "sentinel announce-hostnames yes",
                       f"sentinel monitor {MASTER} localhost {master_port} 1"],
                      sentinel_port, "--sentinel")
    yield sentinel_port
    for proc in (sentinel, master):
        proc.kill()
        proc.wait(10)


def test_the_fast_path_reaches_a_tls_master_through_tls_sentinels(tls_sentinel: int) -> None:
    url = (f"rediss://localhost:1/0?ssl_ca_certs={TLS / 'ca.pem'}"
           f"&ssl_certfile={TLS / 'client.pem'}&ssl_keyfile={TLS / 'client.key'}")

    async def go() -> dict[str, str]:
        cache = RedisDedupCache.from_sentinels(
            [("localhost", tls_sentinel)], MASTER, url, sentinel_password="",
            ttl_seconds=600, timeout_seconds=2)
        try:
            assert await cache.ping()
            assert await cache.set_many({"TLS-1": "fp-1", "TLS-2": "fp-2"})
            return await cache.get_many(["TLS-1", "TLS-2", "TLS-3"])
        finally:
            await cache.close()

    assert asyncio.run(go()) == {"TLS-1": "fp-1", "TLS-2": "fp-2"}


def test_without_the_tls_settings_the_sentinels_cannot_be_asked(tls_sentinel: int) -> None:
    async def go() -> None:
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it bare
            [("localhost", tls_sentinel)], sentinel_kwargs={"socket_timeout": 2})
        await sentinel.discover_master(MASTER)

    with pytest.raises(RedisError):
        asyncio.run(go())
