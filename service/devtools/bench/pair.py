"""PostgreSQL's CPU per message of the worker's statement, this tree against another
revision, paired: how a change to the SQL (a definition, an index, a migration) is measured
before it is kept (docs/benchmark.md, "Where PostgreSQL's CPU per authorization goes").

    python -m service.devtools.bench.pair --base REV
        [--kind purchases|lifecycle|cards|limits]
        [--rounds 4] [--calls 30] [--batch 1000]

Each side gets a database of its own, made by its own tree's ``payauth migrate`` (the base's
from a checkout of REV in a temporary directory), 10,000 euro accounts, and a pgbench script
of its own statement (``pgbench.script``: purchases of 1.00 on random accounts, one call a
batch; ``pgbench.lifecycle_script``: a batch of AUTHORIZATIONs, then a CLEARING of each;
``pgbench.cards_script``: purchases naming their account's card, without limits, and
``pgbench.limits_script``: on a card with a daily and a monthly limit each, never reached:
what ``make bench``'s limits phase compares).
The sides then run in turn, ABBA, ``--calls`` scripts each turn on one session (run by this
process as pgbench would: its variables drawn, each call planned for its own values), while
nothing else runs: the CPU of every PostgreSQL process (the backend, the WAL writer,
autovacuum: what the primary pays, as ``cpu.py`` reads it), the session's backend's alone
(the statement's own cost, far less noisy: autovacuum comes in bursts) and the WAL
written, per message.
Each side's store grows alike, turn by turn. A line per turn, then the medians and their
ratio (this tree / base: below 1 is cheaper).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from service.config import load_settings
from service.devtools import scratch
from service.devtools.bench import cpu, pgbench

ROOT = Path(__file__).resolve().parents[3]
ACCOUNTS = 10_000

_PREPARE = """
import asyncio, sys
from service.adapters.postgres import AUTHORIZE_STATEMENT
from service.devtools import scratch
dsn, name, out = sys.argv[1:4]
print(asyncio.run(scratch.create_database(dsn, name)))
open(out, "w").write(AUTHORIZE_STATEMENT)
"""
# A kind's script, and the messages a run of it decides per batch.
SCRIPTS = {"purchases": (pgbench.script, 1), "lifecycle": (pgbench.lifecycle_script, 2),
           "cards": (pgbench.cards_script, 1), "limits": (pgbench.limits_script, 1)}


def _prepare(tree: Path, dsn: str, name: str, kind: str, batch: int, script: Path) -> str:
    """A database ``name`` migrated by ``tree``'s code, and a pgbench script of ``tree``'s
    statement in ``script``; returns the database's DSN."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    statement = script.with_suffix(".statement")
    done = subprocess.run([sys.executable, "-c", _PREPARE, dsn, name, str(statement)],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"pair: preparing {name} from {tree} failed:\n{done.stderr[-3000:]}")
    build, _ = SCRIPTS[kind]
    script.write_text(build(batch, ACCOUNTS, statement.read_text()))
    return done.stdout.strip().splitlines()[-1]


async def _seed(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO accounts (account_id, balance, opening_balance, currency) "
            f"SELECT 'BA-' || lpad(g::text, 5, '0'), 1e9, 1e9, 'EUR' "
            f"FROM generate_series(0, {ACCOUNTS - 1}) g")
        # Two cards an account, as the bench's limits phase: BP-n without limits, BK-n with
        # a daily and a monthly limit that no run reaches.
        await conn.execute(
            "INSERT INTO cards (card_id, account_id) "
            "SELECT p || lpad(g::text, 5, '0'), 'BA-' || lpad(g::text, 5, '0') "
            f"FROM generate_series(0, {ACCOUNTS - 1}) g, unnest(ARRAY['BP-', 'BK-']) p")
        await conn.execute(
            "INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount, "
            "max_count) "
            "SELECT 'L' || left(p, 1) || '-' || lpad(g::text, 5, '0'), 'CARD', "
            "'BK-' || lpad(g::text, 5, '0'), p, 1e12, 2000000000 "
            f"FROM generate_series(0, {ACCOUNTS - 1}) g, unnest(ARRAY['DAY', 'MONTH']) p")
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def _wal_lsn(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"))
    finally:
        await conn.close()


async def _drive(dsn: str, script: str, calls: int) -> float:
    """Run ``script`` ``calls`` times on one session, as pgbench would (its ``\\set``
    variables drawn at random, the statement planned for its own values and never compiled,
    as the worker's sessions do, adapters/postgres.py); returns the CPU that session's
    backend used, in seconds: the statement's own cost, without what the WAL writer, the
    checkpointer or autovacuum did meanwhile."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan; SET jit = off")
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        before = cpu.seconds(backend)
        await run_calls(conn, script, calls, random.Random())
        return cpu.seconds(backend) - before
    finally:
        await conn.close()


async def run_calls(conn: asyncpg.Connection, script: str, calls: int,
                    draw: random.Random) -> None:
    """Run ``script`` ``calls`` times on ``conn``, as pgbench would: its ``\\set`` variables
    drawn from ``draw`` (a key, an account) for each call."""
    lines = [line for line in script.splitlines() if line and not line.startswith("\\")]
    for _ in range(calls):
        values = {"client_id": "0", "n": str(draw.randint(1, 2_000_000_000)),
                  "a": str(draw.randrange(ACCOUNTS))}
        for line in lines:
            await conn.execute(_with_values(line, values))


_VARIABLE = re.compile(r":(client_id|n|a)\b")


def _with_values(line: str, values: dict[str, str]) -> str:
    """A script's line with pgbench's variables replaced by their values."""
    return _VARIABLE.sub(lambda m: values[m.group(1)], line)


def _turn(dsn: str, script: Path, calls: int, messages: int) -> tuple[float, float, float]:
    """µs of PostgreSQL CPU per message over one turn (``messages`` a run of the script):
    every PostgreSQL process's, the session's backend's alone; and bytes of WAL."""
    import asyncio

    wal = asyncio.run(_wal_lsn(dsn))
    before = cpu.sample(worker_pid=-1)
    backend = asyncio.run(_drive(dsn, script.read_text(), calls))
    time.sleep(0.5)  # the backend ended: counted once its postmaster has reaped it
    after = cpu.sample(worker_pid=-1)
    wal = asyncio.run(_wal_lsn(dsn)) - wal
    n = calls * messages
    return cpu.per_item(before, after, n)["postgres"], backend / n * 1e6, wal / n


def main() -> int:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to measure against")
    parser.add_argument("--kind", choices=sorted(SCRIPTS), default="purchases")
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds")
    parser.add_argument("--calls", type=int, default=30, help="runs of the script a turn")
    parser.add_argument("--batch", type=int, default=1000, help="messages a call")
    args = parser.parse_args()

    dsn = load_settings().database_url.get_secret_value()
    run = uuid.uuid4().hex[:8]
    names = {"base": f"pair_{run}_base", "this": f"pair_{run}_this"}
    with tempfile.TemporaryDirectory(prefix="payauth-pair-") as tmp:
        base_tree = Path(tmp, "base")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree),
                        args.base], check=True, capture_output=True)
        try:
            trees = {"base": base_tree, "this": ROOT}
            scripts = {side: Path(tmp, f"{side}.sql") for side in trees}
            dsns = {side: _prepare(trees[side], dsn, names[side], args.kind, args.batch,
                                   scripts[side])
                    for side in trees}
            messages = args.batch * SCRIPTS[args.kind][1]
            for side_dsn in dsns.values():
                asyncio.run(_seed(side_dsn))
            figures: dict[str, list[tuple[float, float, float]]] = {"base": [], "this": []}
            for _ in range(2):  # warm both: caches, plans, the first periods
                for side in trees:
                    _turn(dsns[side], scripts[side], max(2, args.calls // 5), messages)
            for r in range(args.rounds):
                order = ("base", "this") if r % 2 == 0 else ("this", "base")
                for side in order + tuple(reversed(order)):
                    us, backend, wal = _turn(dsns[side], scripts[side], args.calls, messages)
                    figures[side].append((us, backend, wal))
                    print(f"round {r + 1} {side:<4} {us:7.1f} µs ({backend:5.1f} the backend) "
                          f"{wal:7.0f} B WAL per message", flush=True)
                    time.sleep(1)
            med = {side: tuple(statistics.median(f[i] for f in figures[side]) for i in range(3))
                   for side in figures}
            for side, (us, backend, wal) in med.items():
                print(f"median {side:<4} {us:7.1f} µs ({backend:5.1f} the backend) "
                      f"{wal:7.0f} B WAL per message")
            print(f"ratio this/base: CPU {med['this'][0] / med['base'][0]:.3f} (the backend "
                  f"{med['this'][1] / med['base'][1]:.3f}), "
                  f"WAL {med['this'][2] / med['base'][2]:.3f}")
        finally:
            for name in names.values():
                asyncio.run(scratch.drop_database(dsn, name))
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base_tree)], check=False, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
