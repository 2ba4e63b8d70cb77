"""``payauth migrate`` (``service/ops/migrate.py``): replicas starting together each run it and
under its advisory lock every migration is applied exactly once; every ``payauth_*``
function and view has one file in ``sql/``, re-applied when it changes; a database migrated
by today's tool from nothing and one that ran migrations 001-012 with the tool before
``sql/`` existed end with the same schema and the same definitions."""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from service.ops.migrate import (
    CREATE_OPTIONS,
    DEFINITIONS_DIR,
    MIGRATIONS_DIR,
    definition_files,
    migrate,
)
from tests.support import stack
from tests.support.stack import ROOT

# Every object the definitions own, named by the file that holds it: functions of public
# named payauth_* (and the trigger function) and every view.
_OBJECTS = """
SELECT p.proname AS name, 'function' AS kind FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public' AND p.proname LIKE 'payauth\\_%'
UNION ALL
SELECT viewname, 'view' FROM pg_views WHERE schemaname = 'public'
"""
# What a schema is made of, in a comparable form: two databases with equal answers have the
# same tables, constraints, indexes, triggers, grants, functions and views.
_SCHEMA = {
    "columns": """SELECT table_name, column_name, data_type, is_nullable, column_default
                    FROM information_schema.columns WHERE table_schema = 'public'
                   ORDER BY 1, 2""",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
                        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
                       ORDER BY 1, 2""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes "
               "WHERE schemaname = 'public' ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE NOT tgisinternal ORDER BY 1, 2",
    # (The migration tool's own tables aside: made before or after migration 002 revoked
    # every grant, their owner's default privileges read as written out or as NULL.)
    "table_grants": "SELECT relname, relacl::text, reloptions::text FROM pg_class "
                    "WHERE relnamespace = 'public'::regnamespace "
                    "AND relname NOT LIKE 'schema\\_%' ORDER BY 1",
    "column_grants": "SELECT table_name, column_name, privilege_type, grantee "
                     "FROM information_schema.column_privileges WHERE table_schema = 'public' "
                     "AND grantee = 'payauth_worker' ORDER BY 1, 2, 3",
    "functions": """SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text
                      FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
                     ORDER BY 1""",
    "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public' ORDER BY 1",
}


@pytest.fixture
def empty_database(live_stack: None) -> Iterator[Callable[..., str]]:
    """Makes empty databases (as many as a test asks for), dropped afterwards."""
    names: list[str] = []

    def make(options: str = CREATE_OPTIONS) -> str:
        name = f"payauth_m_{uuid.uuid4().hex[:10]}"
        stack.fetch(stack.PG_ADMIN_DSN, f'CREATE DATABASE "{name}" {options}')
        names.append(name)
        return stack.dsn_for(name)

    yield make
    for name in names:
        asyncio.run(stack.drop_database(name))


async def _as_the_tool_before_definitions(dsn: str, upto: str = "012") -> None:
    """What ``payauth migrate`` did before ``sql/`` existed: each migration up to ``upto``
    once, in name order, recorded in schema_migrations."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE schema_migrations (version text PRIMARY KEY, "
                           "applied_at timestamptz NOT NULL DEFAULT now())")
        for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
            if path.name[:3] > upto:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations VALUES ($1)", path.name)
    finally:
        await conn.close()


async def _schema(dsn: str) -> dict[str, list[tuple[object, ...]]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {k: [tuple(r) for r in await conn.fetch(q)] for k, q in _SCHEMA.items()}
    finally:
        await conn.close()


def test_two_migrations_at_once_apply_each_file_once(empty_database: Callable[[], str]) -> None:
    dsn = empty_database()
    env = {"PATH": "/usr/bin:/bin", "PAYAUTH_DATABASE_URL": dsn, "PAYAUTH_LOG_LEVEL": "WARNING"}
    both = [subprocess.Popen([sys.executable, "-m", "service", "migrate"], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in both]
    assert [p.returncode for p in both] == [0, 0], outputs
    files = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    applied = [r["version"] for r in stack.fetch(
        dsn, "SELECT version FROM schema_migrations ORDER BY version")]
    assert applied == files
    defined = [p.name for p in definition_files()]
    # One of the two applied them all; the other found the schema up to date.
    said = sorted(out.strip() for out, _err in outputs)
    assert said == [f"migrate: applied {', '.join(files)}\n"
                    f"migrate: defined {', '.join(defined)}", "migrate: up to date"]


def test_a_database_collating_through_the_locale_is_migrated_and_said_to_be_slower(
        empty_database: Callable[..., str]) -> None:
    """A database made as payauth's are (``CREATE_OPTIONS``) says nothing of its collation;
    one made otherwise is migrated all the same, and its operator told once per run."""
    made_so = asyncio.run(migrate(empty_database())).render()
    made_otherwise = empty_database("TEMPLATE template0 LC_COLLATE 'C.UTF-8'")
    said = asyncio.run(migrate(made_otherwise)).render().splitlines()
    assert "collates" not in made_so
    assert said[0].startswith("migrate: applied 001_schema.sql")
    assert said[-1] == ("migrate: note: this database collates text as 'C.UTF-8', not 'C': "
                        "every key compared costs more (docs/operations.md, \"The database's "
                        "collation\")")
    assert stack.fetch(made_otherwise, "SELECT count(*) AS n FROM schema_migrations")[0]["n"] \
        == len(list(MIGRATIONS_DIR.glob("*.sql")))


def test_every_payauth_function_and_view_has_exactly_one_file(env: stack.Env) -> None:
    objects = stack.fetch(env.dsn, _OBJECTS)
    names = [r["name"] for r in objects]
    assert len(names) == len(set(names)), f"overloaded or twice defined: {sorted(names)}"
    files = {p.stem: p.read_text() for p in DEFINITIONS_DIR.glob("*.sql")}
    assert set(names) == set(files), (sorted(set(names) - set(files)),
                                      sorted(set(files) - set(names)))
    for name, text in files.items():
        created = re.findall(r"^CREATE (?:OR REPLACE )?(?:FUNCTION|VIEW) (\w+)", text, re.M)
        assert created == [name], f"sql/{name}.sql defines {created}"


def test_a_fresh_database_and_one_upgraded_from_012_end_the_same(
        empty_database: Callable[[], str]) -> None:
    fresh, upgraded = empty_database(), empty_database()
    asyncio.run(migrate(fresh))
    asyncio.run(_as_the_tool_before_definitions(upgraded))
    said = asyncio.run(migrate(upgraded))
    # The migrations after 012 (if any), and every definition: none was recorded.
    assert said.migrations == [p.name for p in sorted(MIGRATIONS_DIR.glob("*.sql"))
                               if p.name[:3] > "012"]
    assert said.definitions == [p.name for p in definition_files()]
    fresh_schema, upgraded_schema = asyncio.run(_schema(fresh)), asyncio.run(_schema(upgraded))
    for part in _SCHEMA:
        assert fresh_schema[part] == upgraded_schema[part], part


def test_the_rule_version_is_the_rule_files_whatever_the_path(
        empty_database: Callable[[], str]) -> None:
    """The version recorded with each decision is the md5 of the bodies of the rule's four
    functions, as their files have them, whichever way the database came to them."""
    bodies = []
    for name in ("payauth_decide", "payauth_account_amount", "payauth_approved",
                 "payauth_card_verdict"):
        body = re.search(r"AS \$\$(.*?)\$\$;", (DEFINITIONS_DIR / f"{name}.sql").read_text(),
                         re.S)
        assert body, name
        bodies.append(body.group(1))
    expected = hashlib.md5("".join(bodies).encode()).hexdigest()[:12]
    fresh, upgraded = empty_database(), empty_database()
    asyncio.run(migrate(fresh))
    asyncio.run(_as_the_tool_before_definitions(upgraded))
    asyncio.run(migrate(upgraded))
    for dsn in (fresh, upgraded):
        assert stack.fetch(dsn, "SELECT payauth_rule_version() AS v")[0]["v"] == expected


def test_a_changed_definition_alone_is_applied_again(empty_database: Callable[[], str],
                                                     tmp_path: Path) -> None:
    dsn = empty_database()
    asyncio.run(migrate(dsn))
    assert asyncio.run(migrate(dsn)).render() == "migrate: up to date"
    changed = tmp_path / "sql"
    shutil.copytree(DEFINITIONS_DIR, changed)
    path = changed / "payauth_expire_holds.sql"
    path.write_text(path.read_text().replace("    cutoff timestamptz",
                                             "    -- a comment inside the body\n"
                                             "    cutoff timestamptz"))
    assert asyncio.run(migrate(dsn, definitions=changed)).definitions == \
        ["payauth_expire_holds.sql"]
    source = stack.fetch(dsn, "SELECT prosrc FROM pg_proc WHERE proname = "
                              "'payauth_expire_holds'")[0]["prosrc"]
    assert "a comment inside the body" in source
    assert asyncio.run(migrate(dsn, definitions=changed)).render() == "migrate: up to date"
    # Back to the packaged file: applied again, the body as the repository has it.
    assert asyncio.run(migrate(dsn)).definitions == ["payauth_expire_holds.sql"]
    source = stack.fetch(dsn, "SELECT prosrc FROM pg_proc WHERE proname = "
                              "'payauth_expire_holds'")[0]["prosrc"]
    assert "a comment inside the body" not in source
