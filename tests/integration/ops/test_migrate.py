"""``payauth migrate`` (``service/ops/migrate.py``): replicas starting together each run it;
under its advisory lock every migration is applied exactly once, and both exit 0."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

from tests.support import stack
from tests.support.stack import ROOT


def test_two_migrations_at_once_apply_each_file_once(live_stack: None) -> None:
    name = f"payauth_m_{uuid.uuid4().hex[:10]}"
    stack.fetch(stack.PG_ADMIN_DSN, f'CREATE DATABASE "{name}"')
    try:
        env = {"PATH": "/usr/bin:/bin", "PAYAUTH_DATABASE_URL": stack.dsn_for(name),
               "PAYAUTH_LOG_LEVEL": "WARNING"}
        both = [subprocess.Popen([sys.executable, "-m", "service", "migrate"], cwd=ROOT,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
        outputs = [p.communicate(timeout=120) for p in both]
        assert [p.returncode for p in both] == [0, 0], outputs
        files = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
        applied = [r["version"] for r in stack.fetch(
            stack.dsn_for(name), "SELECT version FROM schema_migrations ORDER BY version")]
        assert applied == files
        # One of the two applied them all; the other found the schema up to date.
        said = sorted(out.strip() for out, _err in outputs)
        assert said == [f"migrate: applied {', '.join(files)}", "migrate: up to date"]
    finally:
        asyncio.run(stack.drop_database(name))
