"""Worker processes seen from outside: start ``payauth run``, find its metrics port in its log,
scrape it, signal it, see whether a port listens or find one free. Used by the demo, the
chaos run, the benchmark and the tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def free_port() -> int:
    """A port of the loopback nobody listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# How to run a PostgreSQL server's programs: as ``postgres`` when this process is root
# (initdb and postgres refuse root), as this user otherwise.
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def postgres_bindir() -> Path:
    """The newest Debian server binaries (as deploy/local/stack.sh finds them), or
    pg_ctl's directory on PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                   key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    if found:
        return found[-1]
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise RuntimeError("no PostgreSQL server binaries (make stack-up installs them)")
    return Path(pg_ctl).parent


def port_open(host: str, port: int) -> bool:
    """Something listens on ``host``:``port`` (half a second to connect)."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def parse_metrics(text: str) -> dict[str, float]:
    """'name{labels}' → value, for every sample line of a Prometheus text exposition; and,
    for a sample with several labels, 'name{label="v"}' → the sum over the other labels
    (as PromQL's ``sum by``): ``payauth_duplicates_total{layer="redis"}`` keeps reading the
    same total now that the series also has ``cause``."""
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
            out[name + labels] = value
            pairs = _LABEL.findall(labels)
            if len(pairs) > 1:
                for label, label_value in pairs:
                    key = f'{name}{{{label}="{label_value}"}}'
                    sums[key] = sums.get(key, 0.0) + value
    return {**sums, **out}


class WorkerProcess:
    def __init__(self, env: dict[str, str], log_path: Path, *,
                 placement: tuple[tuple[str, ...], str] = ((), "127.0.0.1")) -> None:
        """``placement``: the command prefix that starts it elsewhere (a network namespace:
        ``ip netns exec NAME``) and the address its metrics are reached at from here."""
        self.env = env
        self.log_path = log_path
        self._prefix, self._host = placement
        self.proc: subprocess.Popen[bytes] | None = None
        configured = int(env.get("PAYAUTH_METRICS_PORT", "0") or 0)
        self._port: int | None = configured or None  # 0: the worker picks one and logs it

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The production command, unless a fault is asked for: then the dev entry point,
        # which wires the fault-injecting adapters in.
        faulty = any(self.env.get(k) for k in ("PAYAUTH_TEST_FAULT_POINT",
                                               "PAYAUTH_TEST_UNSAFE_ORDERING"))
        command = ["service.devtools", "worker"] if faulty else ["service", "run"]
        with self.log_path.open("wb") as log:  # a fresh log: its port line is this run's
            self.proc = subprocess.Popen(
                [*self._prefix, sys.executable, "-m", *command], cwd=ROOT, env=self.env,
                stdout=log, stderr=subprocess.STDOUT,
            )
        return self

    def logs(self) -> list[dict[str, Any]]:
        out = []
        if self.log_path.exists():
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
        return out

    def raw_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def port(self, timeout: float = 30) -> int:
        """The metrics port the worker bound (it logs it at start; port 0 picks a free one)."""
        deadline = time.monotonic() + timeout
        while self._port is None:
            started = self.events("worker_starting")
            if started:
                self._port = int(started[-1]["metrics_port"])
            elif time.monotonic() > deadline or not self.alive():
                raise RuntimeError(f"worker did not start; log:\n{self.raw_log()[-2000:]}")
            else:
                time.sleep(0.1)
        return self._port

    def http_get(self, path: str) -> tuple[int, str]:
        url = f"http://{self._host}:{self.port()}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.http_get("/metrics")[1])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)
