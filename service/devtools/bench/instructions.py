"""PostgreSQL's instructions per message of the worker's statement, this tree against another
revision: a count, not a time, so the same on a busy machine as on a quiet one
(docs/benchmark.md, "Where PostgreSQL's CPU per authorization goes").

    python -m service.devtools.bench.instructions --base REV
        [--kind purchases|lifecycle|cards|limits] [--calls 4] [--batch 1000] [--warm 30]

``pair`` times each side's backend; on this machine kind its runs vary by about 7 %, more
than many a change is worth. This tool runs a server of its own under valgrind's callgrind,
which counts the instructions each process executes, whatever else the machine does. Each
side gets a database on it made by its own tree's ``payauth migrate``, seeded as ``pair``
seeds (the base's from a checkout of REV), and ``--warm`` calls run on it uncounted: the
store and the limits' usage as a backlog leaves them (a purchase then raises its card's
usage rows more often than it makes them, as in ``make bench``). Then, for each side, two
sessions of ``pair``'s script, each a backend of its own, each message a new key: one of a
single call, one of 1 + ``--calls`` calls. What the longer one executed more, over the
messages of its extra calls, is what a message costs, without the session's start, its
first plans and its catalog caches.

Instructions are not time: a cache miss or a lock wait costs no instruction, and the same
count can run faster or slower. What this tells is what a change takes out of or adds to
the work PostgreSQL does, to the percent; ``pair`` says what that is worth in time.

Needs valgrind and a PostgreSQL server's binaries (initdb, postgres) on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from service.devtools.bench import pair
from service.devtools.processes import AS_POSTGRES, free_port, postgres_bindir

# Each message's store grows alike on both sides; a fixed seed draws the same accounts.
_SEED = 20261207


class CountedServer:
    """A throw-away PostgreSQL cluster in ``directory``: started plainly to be prepared,
    then again under callgrind, every backend it forks counted in a file of its own."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(exist_ok=True)
        self.directory = directory
        self.data = directory / "data"
        self.port = free_port()
        self.bindir = postgres_bindir()
        self._server: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres")
        subprocess.run([*AS_POSTGRES, str(self.bindir / "initdb"), "-D", str(self.data),
                        "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, capture_output=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, *, counted: bool) -> None:
        command = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                   "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                   "-c", "shared_buffers=256MB", "-c", "autovacuum=off", "-c", "jit=off"]
        if counted:
            command = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                       f"--callgrind-out-file={self.directory}/counted.%p", *command]
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 (the server's)
        self._server = subprocess.Popen([*AS_POSTGRES, *command], stdout=log, stderr=log)
        deadline = time.monotonic() + 180  # under valgrind, startup takes seconds
        while time.monotonic() < deadline:
            try:
                asyncio.run(self._ping())
                return
            except (OSError, asyncpg.PostgresError):
                time.sleep(0.5)
        raise SystemExit(f"instructions: the server did not start, see {log.name}")

    async def _ping(self) -> None:
        await (await asyncpg.connect(self.dsn(), timeout=5)).close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.terminate()  # SIGTERM: a smart shutdown, once the sessions ended
            self._server.wait(timeout=180)
            self._server = None

    def executed(self, pid: int) -> int:
        """The instructions backend ``pid`` executed, from its file (written as it exits)."""
        path = self.directory / f"counted.{pid}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    if line.startswith("totals:"):
                        return int(line.split()[1])
            time.sleep(0.5)
        raise SystemExit(f"instructions: no count for backend {pid} in {path}")


async def _session(dsn: str, script: str, calls: int, seed: int = _SEED) -> int:
    """Run ``script`` ``calls`` times on a session of its own, its values drawn from
    ``seed``; returns its backend's pid."""
    conn = await asyncpg.connect(dsn, timeout=120, command_timeout=3600)
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan; SET jit = off")
        pid = int(await conn.fetchval("SELECT pg_backend_pid()"))
        await pair.run_calls(conn, script, calls, random.Random(seed))
        return pid
    finally:
        await conn.close()


def per_message(server: CountedServer, dsn: str, script: str, calls: int,
                messages: int) -> float:
    """Instructions a message: a session of 1 + ``calls`` calls less one of 1 call (drawn
    from another seed: its keys are new to the longer session too)."""
    short = server.executed(asyncio.run(_session(dsn, script, 1, seed=_SEED + 2)))
    long = server.executed(asyncio.run(_session(dsn, script, 1 + calls)))
    return (long - short) / (calls * messages)


def measure(trees: dict[str, Path], kind: str, calls: int, batch: int,
            warm: int = 0) -> dict[str, float]:
    """Instructions a message for each side (a tree), on one counted server, after ``warm``
    calls uncounted."""
    with tempfile.TemporaryDirectory(prefix="payauth-counted-") as tmp:
        os.chmod(tmp, 0o711)  # the server's owner (postgres, under root) reaches its own
        return _measure(trees, kind, calls, batch, warm, Path(tmp, "server"))


def _measure(trees: dict[str, Path], kind: str, calls: int, batch: int, warm: int,
             directory: Path) -> dict[str, float]:
    server = CountedServer(directory)
    scripts = {side: directory / f"{side}.sql" for side in trees}
    server.start(counted=False)
    try:
        dsns = {side: pair._prepare(tree, server.dsn(), f"counted_{side}", kind, batch,
                                    scripts[side])
                for side, tree in trees.items()}
        for side, side_dsn in dsns.items():
            asyncio.run(pair._seed(side_dsn))
            # (Other values than the counted calls': theirs are new keys, not duplicates.)
            asyncio.run(_session(side_dsn, scripts[side].read_text(), warm, seed=_SEED + 1))
    finally:
        server.stop()
    server.start(counted=True)
    try:
        messages = batch * pair.SCRIPTS[kind][1]
        return {side: per_message(server, dsns[side], scripts[side].read_text(), calls,
                                  messages)
                for side in trees}
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to measure against")
    parser.add_argument("--kind", choices=sorted(pair.SCRIPTS), default="purchases")
    parser.add_argument("--calls", type=int, default=4, help="calls counted a side")
    parser.add_argument("--batch", type=int, default=1000, help="messages a call")
    parser.add_argument("--warm", type=int, default=30, help="calls run first, uncounted")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("instructions: valgrind is not installed (make test-tools installs it)")
    with tempfile.TemporaryDirectory(prefix="payauth-instructions-") as tmp:
        base_tree = Path(tmp, "base")
        subprocess.run(["git", "-C", str(pair.ROOT), "worktree", "add", "--detach",
                        str(base_tree), args.base], check=True, capture_output=True)
        try:
            figures = measure({"base": base_tree, "this": pair.ROOT}, args.kind, args.calls,
                              args.batch, args.warm)
        finally:
            subprocess.run(["git", "-C", str(pair.ROOT), "worktree", "remove", "--force",
                            str(base_tree)], check=False, capture_output=True)
    for side, count in figures.items():
        print(f"{side:<4} {count:12,.0f} instructions per message")
    print(f"ratio this/base: {figures['this'] / figures['base']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
