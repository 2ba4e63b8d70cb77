"""A PostgreSQL primary and a streaming standby on loopback, for failover tests: real
PostgreSQL replication (``pg_basebackup``, ``primary_conninfo``), synchronous or not, and a
promotion by ``pg_ctl promote`` after the primary is killed. PostgreSQL refuses to run as
root: as root, the clusters belong to the ``postgres`` user (as in ``deploy/local/stack.sh``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from service.devtools.processes import AS_POSTGRES, postgres_bindir
from tests.support.stack import fetch, free_port

BIN = postgres_bindir()
AS_OWNER = [*AS_POSTGRES, "env", "-C", "/"] if AS_POSTGRES else []
STANDBY_NAME = "standby"


def _run(*args: str) -> None:
    done = subprocess.run([*AS_OWNER, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr[-2000:]}")


@dataclass
class Node:
    data: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}/{database}"

    def start(self) -> None:
        _run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.data / "server.log"),
             "-w", "-t", "60", "start")

    def stop(self) -> None:
        subprocess.run([*AS_OWNER, str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                        "-w", "stop"], capture_output=True)

    def kill9(self) -> None:
        """SIGKILL the postmaster; its backends go with it (they exit when it is gone)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def caught_up_with(self, primary: Node) -> bool:
        """Has this standby replayed everything the primary wrote so far?"""
        rows = fetch(primary.dsn(), "SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) "
                                    "AS done FROM pg_stat_replication")
        return bool(rows and rows[0]["done"])

    def promote(self) -> None:
        _run(str(BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")



def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def replicated_pair(*, synchronous: bool) -> tuple[Node, Node, Path]:
    """A running primary and a standby streaming from it (the standby named in
    ``synchronous_standby_names`` when ``synchronous``), and their base directory."""
    base = Path(tempfile.mkdtemp(prefix="payauth-pg-"))
    if AS_OWNER:
        shutil.chown(base, "postgres", "postgres")
    primary, standby = Node(base / "a", free_port()), Node(base / "b", free_port())
    _run(str(BIN / "initdb"), "-D", str(primary.data), "-U", "postgres", "--auth=trust",
         "-E", "UTF8", "--locale=C.UTF-8")
    _append(primary.data / "postgresql.auto.conf", [
        "listen_addresses = '127.0.0.1'", f"port = {primary.port}",
        "unix_socket_directories = '/tmp'", "shared_buffers = 32MB", "wal_level = replica",
        "max_wal_senders = 4", "hot_standby = on", "synchronous_commit = on",
        f"synchronous_standby_names = '{STANDBY_NAME if synchronous else ''}'",
        "log_min_messages = warning"])
    primary.start()
    _run(str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U",
         "postgres", "-D", str(standby.data), "-R", "-X", "stream")
    _append(standby.data / "postgresql.auto.conf", [
        # The copy of the primary's settings names a synchronous standby; promoted, this one
        # has none, and would wait for it on every COMMIT.
        f"port = {standby.port}", "synchronous_standby_names = ''",
        f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
        f"application_name={STANDBY_NAME}'"])
    standby.start()
    return primary, standby, base


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as out:
        out.write("\n".join(lines) + "\n")
    if AS_OWNER:
        shutil.chown(path, "postgres", "postgres")


def remove(base: Path, *nodes: Node) -> None:
    for node in nodes:
        node.stop()
    shutil.rmtree(base, ignore_errors=True)
