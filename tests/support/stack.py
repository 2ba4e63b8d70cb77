"""The real services the integration tests talk to: PostgreSQL, Redis and Kafka from the
local stack (``make stack-up``), or another stack's (``use``: the secured stack's tier).
Every test gets its own database, topics and group, so tests neither see each other's data
nor depend on order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from service.adapters.kafka.admin import committed_offsets as kafka_committed
from service.adapters.postgres import PostgresStore
from service.devtools.processes import free_port as free_port  # (the tests call stack.free_port)
from service.devtools.processes import port_open
from service.domain.dedup import StoredResult
from service.domain.messages import Authorization
from service.ops.migrate import CREATE_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = os.environ.get("PAYAUTH_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
PG_ADMIN_DSN = os.environ.get("PAYAUTH_TEST_ADMIN_DSN", "postgresql://localhost:5432/postgres")
REDIS_URL = os.environ.get("PAYAUTH_REDIS_URL", "redis://localhost:6379/0")
# One per test session: two sessions on one stack (two checkouts) never drop each other's.
TEMPLATE_DB = f"payauth_test_template_{os.getpid()}"


@dataclass
class Endpoints:
    """Where the tests' own clients connect, and as whom: librdkafka settings (address and
    security), the database administrator's URL (a database name of it is replaced per
    test), Redis; and the ``PAYAUTH_*`` settings a worker gets besides the test's topics,
    group and database (``worker_dsn``: the worker's own login, when not the admin's)."""

    kafka: dict[str, str]
    pg_admin_dsn: str
    redis_url: str
    worker_settings: dict[str, str] = field(default_factory=dict)
    worker_dsn: str | None = None


ENDPOINTS = Endpoints(kafka={"bootstrap.servers": BOOTSTRAP}, pg_admin_dsn=PG_ADMIN_DSN,
                      redis_url=REDIS_URL)


def use(endpoints: Endpoints) -> None:
    """Point every helper here at another stack for the rest of the session."""
    global ENDPOINTS
    ENDPOINTS = endpoints


def kafka_conf(**more: Any) -> dict[str, Any]:
    return {**ENDPOINTS.kafka, **more}


def with_database(dsn: str, database: str) -> str:
    """``dsn`` naming ``database`` (its query, e.g. sslmode and sslrootcert, kept)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def require_stack() -> None:
    missing = [name for name, port in (("PostgreSQL", 5432), ("Redis", 6379), ("Kafka", 9092))
               if not port_open("127.0.0.1", port)]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not running on localhost: start the stack with `make stack-up`"
        )


def dsn_for(database: str) -> str:
    return with_database(ENDPOINTS.pg_admin_dsn, database)


async def ensure_template() -> None:
    """A migrated template database; each test clones it (much faster than migrating)."""
    from service.ops.migrate import migrate

    conn = await asyncpg.connect(ENDPOINTS.pg_admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", TEMPLATE_DB)
        if exists:
            await conn.execute(f'DROP DATABASE "{TEMPLATE_DB}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}" {CREATE_OPTIONS}')
    finally:
        await conn.close()
    await migrate(dsn_for(TEMPLATE_DB))


async def drop_template() -> None:
    await drop_database(TEMPLATE_DB)


async def create_database(template: str | None = TEMPLATE_DB, prefix: str = "payauth_t_"
                          ) -> str:
    """A new database named ``prefix…``: a clone of ``template`` (the migrated one), or
    empty (None); its name."""
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    cloned = f' TEMPLATE "{template}"' if template else f" {CREATE_OPTIONS}"
    conn = await asyncpg.connect(ENDPOINTS.pg_admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"{cloned}')
    finally:
        await conn.close()
    return name


async def database_before(migration: str, tmp_path: Path) -> tuple[str, str]:
    """A new database as a release before ``migration`` left it (the migrations named
    before it applied, no definition of sql/), for a test of the upgrade: (name, dsn)."""
    from service.ops.migrate import MIGRATIONS_DIR, migrate
    older, no_definitions = tmp_path / "older", tmp_path / "sql"
    older.mkdir()
    no_definitions.mkdir()
    (no_definitions / "ORDER").write_text("")
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if path.name < migration:
            (older / path.name).write_text(path.read_text())
    name = await create_database(template=None)
    await migrate(dsn_for(name), older, no_definitions)
    return name, dsn_for(name)


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(ENDPOINTS.pg_admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@dataclass
class Env:
    """One test's world: a database, three topics, a consumer group, a Redis key space."""

    database: str
    input_topic: str
    output_topic: str
    dlq_topic: str
    group_id: str
    partitions: int
    redis_url: str = field(default_factory=lambda: ENDPOINTS.redis_url)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        return dsn_for(self.database)

    def worker_env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAYAUTH_")}
        env.update(ENDPOINTS.worker_settings)
        worker_dsn = ENDPOINTS.worker_dsn
        env.update(
            PAYAUTH_KAFKA_BOOTSTRAP_SERVERS=ENDPOINTS.kafka["bootstrap.servers"],
            PAYAUTH_GROUP_ID=self.group_id,
            PAYAUTH_INPUT_TOPIC=self.input_topic,
            PAYAUTH_OUTPUT_TOPIC=self.output_topic,
            PAYAUTH_DLQ_TOPIC=self.dlq_topic,
            PAYAUTH_DATABASE_URL=with_database(worker_dsn, self.database) if worker_dsn
            else self.dsn,
            PAYAUTH_REDIS_URL=self.redis_url,
            PAYAUTH_METRICS_PORT="0",
            PAYAUTH_LOG_FORMAT="json",
            PAYAUTH_SESSION_TIMEOUT_MS="6000",
            PAYAUTH_COMMIT_INTERVAL_MS="200",
        )
        env.update(self.extra)
        env.update(overrides)
        return env


def create_topics(names: dict[str, int]) -> None:
    """Create topics {name: partitions} and wait until the broker lists every partition."""
    admin = AdminClient(kafka_conf())
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=p, replication_factor=1) for n, p in names.items()],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=5).topics
        if all(n in topics and len(topics[n].partitions) == p for n, p in names.items()):
            return
        time.sleep(0.1)


def delete_topics(names: list[str]) -> None:
    admin = AdminClient(kafka_conf())
    for future in admin.delete_topics(names, operation_timeout=30).values():
        with contextlib.suppress(Exception):
            future.result()


def producer() -> Producer:
    return Producer(kafka_conf(**{"enable.idempotence": True, "linger.ms": 5}))


def produce(
    topic: str,
    records: Iterable[tuple[bytes | str | None, bytes | None]],
    *,
    partition: int | None = None,
) -> int:
    """Produce (key, value) records and wait for every acknowledgement; return the count."""
    p = producer()
    errors: list[Any] = []
    count = 0
    for key, value in records:
        kwargs: dict[str, Any] = {
            "key": key, "value": value,
            "on_delivery": lambda err, _m: errors.append(err) if err else None,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                p.produce(topic, **kwargs)
                break
            except BufferError:
                p.poll(0.1)
        count += 1
    assert p.flush(30) == 0, "producer did not flush"
    assert not errors, f"delivery failed: {errors[:3]}"
    return count


def read_topic(topic: str, *, expect: int | None = None, timeout: float = 30) -> list[Any]:
    """Every record of ``topic`` from the beginning (waits for ``expect`` records if given)."""
    consumer = Consumer(kafka_conf(**{
        "group.id": f"reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    }))
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        tps = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        highs = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        consumer.assign(tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is None:
                    records.append(msg)
            positions = {tp.partition: tp.offset for tp in consumer.position(tps)}
            caught_up = all(positions.get(p, 0) >= h for p, h in highs.items() if h > 0)
            if expect is None and caught_up:
                break
            if expect is not None and len(records) >= expect:
                break
            if expect is not None and caught_up:
                # New records may still arrive: refresh the high watermarks.
                highs = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1]
                         for tp in tps}
                time.sleep(0.2)
        return records
    finally:
        consumer.close()


def events_of(records: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.value()) for r in records]


def committed_offsets(group_id: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(kafka_conf(**{"group.id": group_id, "enable.auto.commit": False}))
    try:
        return kafka_committed(consumer, [TopicPartition(topic, p) for p in range(partitions)])
    finally:
        consumer.close()


def end_offsets(topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(kafka_conf(**{"group.id": "watermarks"}))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """Run one query on its own connection (from synchronous test code)."""
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


async def until_a_lock_is_awaited(dsn: str, application_name: str | None = None) -> None:
    """Return once a session on ``dsn``'s database (of ``application_name``, if given) waits
    for a lock; fail after 10 s: the interleaving a two-connection test needs never came."""
    for _ in range(200):
        conn = await asyncpg.connect(dsn)
        try:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND application_name = coalesce($1, "
                "application_name)", application_name)
        finally:
            await conn.close()
        if waiting:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nobody ever waited for the lock")


async def authorize_in_order(store: PostgresStore, batch: list[Authorization]
                             ) -> list[StoredResult]:
    """``store.authorize`` for ``batch`` as one partition's messages at offsets 0, 1, …"""
    return list(await store.authorize(batch, source_topic="t",
                                      source_partitions=[0] * len(batch),
                                      source_offsets=list(range(len(batch)))))


async def seed_accounts(dsn: str, accounts: Iterable[tuple[str, Decimal | str, str]],
                        status: str = "ACTIVE") -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany(
            "INSERT INTO accounts (account_id, balance, opening_balance, currency, status) "
            "VALUES ($1, $2::numeric, $2::numeric, $3, $4)",
            [(a, str(b), c, status) for a, b, c in accounts],
        )
    finally:
        await conn.close()


def redis_server(port: int, directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A private redis-server the test may stop and start at will (``extra``: more options,
    e.g. ``--replicaof 127.0.0.1 PORT``)."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return _listening(proc, port)


def redis_sentinel(port: int, master: str, master_port: int,
                   directory: Path) -> subprocess.Popen[bytes]:
    """A Sentinel (redis-server in sentinel mode) watching ``master``; it rewrites its own
    configuration file, so each gets one. Quick to act: down after 1 s."""
    config = directory / f"sentinel-{port}.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {master} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {master} 1000\n"
        f"sentinel failover-timeout {master} 5000\n")
    proc = subprocess.Popen(["redis-server", str(config), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _listening(proc, port)


def _listening(proc: subprocess.Popen[bytes], port: int) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"redis-server on port {port} did not start")
        time.sleep(0.05)
    return proc
