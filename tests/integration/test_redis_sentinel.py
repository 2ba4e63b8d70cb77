"""Redis behind Sentinel: the worker finds the master through the Sentinels, and when the
master dies (kill -9) and a replica is promoted, it carries on against the new master. A
failover may lose fast-path entries (replication is asynchronous); PostgreSQL stays the
truth, so nothing is decided twice and nothing is lost."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path

import redis

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until

MASTER = "payauth-cache"


def _send(env: stack.Env, account: str, ids: list[str]) -> list[tuple[bytes, bytes]]:
    records = [(account.encode(), encode(auth_message(t, account_id=account, amount="1.00",
                                                       message_id=f"m-{t}"))) for t in ids]
    stack.produce(env.input_topic, records)
    return records


def _fast_path_entries(port: int) -> int:
    client = redis.Redis(port=port)
    return sum(int(client.hlen(key)) for key in client.scan_iter("dedup:b:*"))


def test_the_worker_follows_a_sentinel_failover(env, spawn_worker, tmp_path: Path) -> None:
    master_port, replica_port = stack.free_port(), stack.free_port()
    sentinel_ports = [stack.free_port() for _ in range(3)]
    servers = [stack.redis_server(master_port, tmp_path)]
    replica_dir = tmp_path / "replica"
    replica_dir.mkdir()
    servers.append(stack.redis_server(replica_port, replica_dir,
                                      "--replicaof", "127.0.0.1", str(master_port)))
    servers += [stack.redis_sentinel(p, MASTER, master_port, tmp_path) for p in sentinel_ports]
    try:
        account = f"ACC-{uuid.uuid4().hex[:6]}"
        asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))
        worker = spawn_worker(
            env, PAYAUTH_REDIS_SENTINELS=",".join(f"127.0.0.1:{p}" for p in sentinel_ports),
            PAYAUTH_REDIS_SENTINEL_MASTER=MASTER)
        first = [f"SEN-{uuid.uuid4().hex[:8]}" for _ in range(20)]
        sent_first = _send(env, account, first)
        wait_caught_up(env.group_id, env.input_topic, env.partitions)
        wait_until(lambda: _fast_path_entries(master_port) >= 20, 20,
                   "the fast path written to the master the Sentinels name")
        assert worker.metrics()["payauth_redis_up"] == 1

        # Sentinels learn of each other and of the replica from the master (every few
        # seconds): a failover needs both.
        sentinel = redis.Redis(port=sentinel_ports[0], decode_responses=True)
        wait_until(lambda: len(sentinel.sentinel_sentinels(MASTER)) == 2
                   and len(sentinel.sentinel_slaves(MASTER)) == 1, 30,
                   "the Sentinels to know each other and the replica")
        servers[0].send_signal(signal.SIGKILL)  # the master dies
        wait_until(lambda: sentinel.sentinel_get_master_addr_by_name(MASTER)[1] == replica_port,
                   60, "the Sentinels to promote the replica")

        stack.produce(env.input_topic, sent_first)  # every first one again: duplicates
        # New transactions, a few at a time, until their fast-path entries show up on the
        # promoted replica: the worker writes to the new master without a restart (a write
        # in the moment Redis is marked down is skipped, by design: hence rounds).
        second: list[str] = []
        new_master = redis.Redis(port=replica_port)

        def written_to_new_master() -> bool:
            ids = [f"SEN-{uuid.uuid4().hex[:8]}" for _ in range(5)]
            _send(env, account, ids)
            second.extend(ids)
            wait_caught_up(env.group_id, env.input_topic, env.partitions)
            return any(new_master.hexists(key, t) for key in new_master.scan_iter("dedup:b:*")
                       for t in second)

        wait_until(written_to_new_master, 60, "the fast path on the new master", interval=1)
        wait_until(lambda: worker.metrics()["payauth_redis_up"] == 1, 30, "redis up again")
        seen = worker.metrics()
        assert seen['payauth_messages_total{outcome="approved"}'] == 20 + len(second)
        assert seen['payauth_messages_total{outcome="duplicate"}'] == 20
        assert worker.alive()
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
    rows = stack.fetch(env.dsn, "SELECT count(*) AS decided, count(DISTINCT txn_id) AS distinct "
                                "FROM processed_transactions")[0]
    assert rows["decided"] == rows["distinct"] == 20 + len(second)
    ledger = stack.fetch(env.dsn, "SELECT count(*) AS n, sum(amount) AS total FROM "
                                  "ledger_entries")[0]
    assert (ledger["n"], ledger["total"]) == (20 + len(second), -(20 + len(second)))
