"""Throw-away databases and topics for the tools that need a world of their own (the
benchmark, the chaos run): created from the migrations, dropped afterwards."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from confluent_kafka.admin import AdminClient

from service.ops.migrate import CREATE_OPTIONS, migrate
from service.ops.topics import NewTopic


def admin_dsn(dsn: str, database: str = "postgres") -> str:
    """The same server(s), another database (to create or drop ``dsn``'s siblings); the
    query (``target_session_attrs=read-write`` for a failover cluster) is kept."""
    base, sep, query = dsn.partition("?")
    return base.rsplit("/", 1)[0] + "/" + database + sep + query


async def _on_server(dsn: str, statement: str) -> None:
    """Run ``statement`` on ``dsn``'s server, from its maintenance database."""
    conn = await asyncpg.connect(admin_dsn(dsn))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def create_database(dsn: str, name: str, *,
                          dedup_period_seconds: int | None = None) -> str:
    """Create database ``name`` on ``dsn``'s server, migrate it (its dedup store's periods
    ``dedup_period_seconds`` long, if given), return its DSN."""
    await _on_server(dsn, f'CREATE DATABASE "{name}" {CREATE_OPTIONS}')
    target = admin_dsn(dsn, name)
    # A multi-host URL asks each host in turn, a standby too, and asyncpg gives up on the
    # first refusal: the standby may not have replayed the CREATE yet (a synchronous
    # standby confirms the WAL is flushed, not applied). It will, in a moment.
    for _ in range(40):
        try:
            await (await asyncpg.connect(target)).close()
            break
        except asyncpg.InvalidCatalogNameError:
            await asyncio.sleep(0.25)
    await migrate(target)
    if dedup_period_seconds is not None:
        conn = await asyncpg.connect(target)
        try:
            await conn.fetch("SELECT * FROM payauth_dedup_set_period($1)", dedup_period_seconds)
        finally:
            await conn.close()
    return target


async def drop_database(dsn: str, name: str) -> None:
    await _on_server(dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_topics(bootstrap: str, partitions: dict[str, int], *,
                  replication_factor: int = 1) -> None:
    """Topics of ``partitions[name]`` partitions; a replicated cluster's brokers supply
    ``min.insync.replicas`` and the rest of the topic defaults."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=count,
                                            replication_factor=replication_factor)
                                   for name, count in partitions.items()])
    for future in futures.values():
        future.result()


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):  # best effort: it is only clean-up
            future.result()
