"""``payauth migrate``: bring a database to this version's schema and rules, under an advisory
lock so that replicas starting together do not race.

Two kinds of SQL, applied in this order:

1. **Migrations** (``migrations/NNN_*.sql``): tables, columns, indexes, grants and data, in
   name order, each once (``schema_migrations``), each in its own transaction. A released
   migration is never edited: a database that ran it must reach the same schema as one
   that runs it now.
2. **Definitions** (``sql/*.sql``): every ``payauth_*`` function and view, one file each,
   holding its current definition (``CREATE OR REPLACE``, and its grants). They are applied
   in the order ``sql/ORDER`` states, all in one transaction, whenever a file's content
   changed since it was last applied (``schema_definitions`` keeps each file's SHA-256) or a
   migration ran now (it may have dropped or changed what a definition rests on). Workers
   see the old set of rules or the new one, never a mix.

So a rule has one home, its file, and a change to it is a change to that file alone.

Then the dedup store's partitions of the period under way and the ones ahead are made where
missing; and a database that collates text otherwise than ``COLLATION`` is said to in a line
of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import structlog

from service.adapters.retention import prepare_periods
from service.config import Settings

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = ROOT / "migrations"
DEFINITIONS_DIR = ROOT / "sql"
ORDER_FILE = "ORDER"
# How a database for payauth is made (docs/operations.md, "The database's collation"): its
# text compared byte by byte ("C"), not through the C library's locale, which costs every
# comparison of a key (an index probe, a sort, a join) a lookup of the locale and a copy of
# both strings. The identifiers are ASCII (their CHECKs): "C" orders them as C.UTF-8 does.
COLLATION = "C"
CREATE_OPTIONS = f"TEMPLATE template0 LC_COLLATE '{COLLATION}'"
# Any constant works; it only has to be the same for every replica.
_LOCK_KEY = 0x7061_7961_7574_68  # "payauth"


class FilesRefused(ValueError):
    """The migration or definition files cannot be applied as they are (one line)."""


@dataclass(frozen=True)
class Applied:
    migrations: list[str]
    definitions: list[str]
    collation: str = COLLATION  # the database's LC_COLLATE

    def render(self) -> str:
        parts = []
        if self.migrations:
            parts.append(f"migrate: applied {', '.join(self.migrations)}")
        if self.definitions:
            parts.append(f"migrate: defined {', '.join(self.definitions)}")
        if not parts:
            parts.append("migrate: up to date")
        if self.collation not in (COLLATION, "POSIX"):
            # Said, not refused: the collation is fixed when a database is made, and one
            # made otherwise is correct, only slower.
            parts.append(f"migrate: note: this database collates text as "
                         f"'{self.collation}', not '{COLLATION}': every key compared costs "
                         "more (docs/operations.md, \"The database's collation\")")
        return "\n".join(parts)


def command(settings: Settings, directory: str | None, definitions: str | None) -> int:
    """``payauth migrate [--dir D] [--sql-dir S]``: what it applied, or one line saying why
    the files cannot be applied (exit 2)."""
    try:
        applied = asyncio.run(migrate(settings.database_url.get_secret_value(),
                                      Path(directory) if directory else MIGRATIONS_DIR,
                                      Path(definitions) if definitions else DEFINITIONS_DIR))
    except FilesRefused as exc:
        print(f"payauth migrate: {exc}", file=sys.stderr)
        return 2
    print(applied.render())
    return 0


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    files = sorted(directory.glob("*.sql"))
    if not files:
        raise FilesRefused(f"no migrations found in {directory}")
    return files


def definition_files(directory: Path = DEFINITIONS_DIR) -> list[Path]:
    """The definitions in the order ``ORDER`` states (one file name per line, ``#``
    comments); every ``*.sql`` of the directory must be listed, and nothing else."""
    order = directory / ORDER_FILE
    if not order.is_file():
        raise FilesRefused(f"no {ORDER_FILE} file in {directory}")
    names = [line.split("#", 1)[0].strip() for line in order.read_text().splitlines()]
    names = [n for n in names if n]
    present = {p.name for p in directory.glob("*.sql")}
    if len(set(names)) != len(names):
        raise FilesRefused(f"{order}: a file is listed twice")
    if set(names) != present:
        missing, unlisted = sorted(set(names) - present), sorted(present - set(names))
        raise FilesRefused(f"{order} and the files disagree: listed but missing {missing}, "
                         f"present but not listed {unlisted}")
    return [directory / n for n in names]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def migrate(dsn: str, directory: Path = MIGRATIONS_DIR,
                  definitions: Path = DEFINITIONS_DIR) -> Applied:
    """Apply what is missing or changed; return what was applied now."""
    files = migration_files(directory)
    defined = definition_files(definitions)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       version text PRIMARY KEY,
                       applied_at timestamptz NOT NULL DEFAULT now());
                   CREATE TABLE IF NOT EXISTS schema_definitions (
                       file text PRIMARY KEY,
                       sha256 text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            applied = []
            for path in files:
                if path.name in done:
                    continue
                async with conn.transaction():
                    await conn.execute(path.read_text())
                    await conn.execute(
                        "INSERT INTO schema_migrations (version) VALUES ($1)", path.name
                    )
                log.info("migration_applied", version=path.name)
                applied.append(path.name)
            result = Applied(applied, await _define(conn, defined, everything=bool(applied)),
                             await conn.fetchval("SELECT datcollate FROM pg_database "
                                                 "WHERE datname = current_database()"))
            await _prepare_dedup_periods(conn)
            return result
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()


async def _prepare_dedup_periods(conn: asyncpg.Connection) -> None:
    """Make the partitions of the period under way and the ones ahead where missing, the
    dedup store's and the limits' charges' (the workers and the purge make them too): a
    store just made or upgraded takes claims in a partition of their own period at once.
    (A migration directory of another version may not define the function.)"""
    if await conn.fetchval("SELECT to_regprocedure('payauth_dedup_prepare(integer, regclass)')"):
        await prepare_periods(conn)


async def _define(conn: asyncpg.Connection, files: list[Path], *, everything: bool
                  ) -> list[str]:
    """Apply the definitions whose content changed (all of them when ``everything``), in
    their stated order, in one transaction; return their file names."""
    known = {r["file"]: r["sha256"]
             for r in await conn.fetch("SELECT file, sha256 FROM schema_definitions")}
    sums = {path.name: digest(path) for path in files}
    if not everything and all(known.get(name) == s for name, s in sums.items()):
        return []
    changed = [p for p in files if everything or known.get(p.name) != sums[p.name]]
    async with conn.transaction():
        for path in changed:
            await conn.execute(path.read_text())
        await conn.executemany(
            """INSERT INTO schema_definitions (file, sha256) VALUES ($1, $2)
               ON CONFLICT (file) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()""",
            [(p.name, sums[p.name]) for p in changed])
        await conn.execute("DELETE FROM schema_definitions WHERE file <> ALL($1::text[])",
                           list(sums))
    for path in changed:
        log.info("definition_applied", file=path.name)
    return [p.name for p in changed]
