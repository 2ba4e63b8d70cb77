"""CPU time per process kind, read from /proc: the figure least moved by a noisy machine.

``CpuClock(worker_pid).sample()`` before and after a phase; ``per_item(before, after, n)``
gives µs of CPU (user + system) per item for the worker, PostgreSQL (every backend and the
postmaster's helpers), the Kafka broker (its JVM) and Redis. A process that ends between the
samples takes its CPU time with it (short-lived connections: a small undercount).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
KINDS = ("worker", "postgres", "broker", "redis")
Sample = dict[str, dict[int, int]]  # kind → pid → clock ticks (utime + stime)


def _ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def _kind(pid: int, worker_pid: int) -> str | None:
    if pid == worker_pid:
        return "worker"
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if comm.startswith("postgres") or comm == "postmaster":
        return "postgres"
    if comm.startswith("redis-server"):
        return "redis"
    if comm == "java" and b"kafka.Kafka" in cmdline:
        return "broker"
    return None


def sample(worker_pid: int) -> Sample:
    out: Sample = {kind: {} for kind in KINDS}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        kind = _kind(pid, worker_pid)
        ticks = _ticks(pid) if kind else None
        if kind and ticks is not None:
            out[kind][pid] = ticks
    return out


def per_item(before: Sample, after: Sample, items: int) -> dict[str, float]:
    """µs of CPU per item, per kind, between two samples."""
    out = {}
    for kind in KINDS:
        ticks = sum(t - before[kind].get(pid, 0) for pid, t in after[kind].items())
        out[kind] = round(ticks / TICKS_PER_SECOND * 1e6 / max(1, items), 1)
    return out
