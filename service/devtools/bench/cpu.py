"""CPU time per process kind, read from /proc: the figure least moved by a noisy machine.

``sample(worker_pid)`` before and after a phase; ``per_item(before, after, n)`` gives µs of
CPU (user + system) per item for the worker, PostgreSQL (every backend and the postmaster's
helpers), the Kafka broker (its JVM) and Redis. A process that ends between the samples
counts in its parent's (a backend's in the postmaster's, once reaped).

``snapshot(worker_pid)`` before and after a step of steady load; ``cores(before, after)``
gives the cores each kind kept busy on average, the load generator's (this process) and the
whole machine's: whether a rate was limited by the machine's CPU, not by a wait.
``waiting(before, after)`` gives, per kind, how long its threads were ready to run but
waited for a core, per unit of time they ran (the kernel's per-thread schedstat). It grows
with how busy the cores are; a woken thread waits some even with cores idle (on 2 cores,
the bare relay's at half a core busy: about 0.7).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
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
    # utime, stime, and the children's it waited for (fields 14 to 17 of stat): a backend
    # that ended between two samples is counted in its postmaster's
    return sum(int(f) for f in fields[11:15])


def seconds(pid: int) -> float:
    """The CPU one process has used so far (user + system), in seconds."""
    ticks = _ticks(pid)
    if ticks is None:
        raise ProcessLookupError(pid)
    return ticks / TICKS_PER_SECOND


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


def _seconds(before: Sample, after: Sample, kind: str) -> float:
    """CPU seconds a kind's processes used between two samples."""
    ticks = sum(t - before[kind].get(pid, 0) for pid, t in after[kind].items())
    return ticks / TICKS_PER_SECOND


def per_item(before: Sample, after: Sample, items: int) -> dict[str, float]:
    """µs of CPU per item, per kind, between two samples."""
    return {kind: round(_seconds(before, after, kind) * 1e6 / max(1, items), 1)
            for kind in KINDS}


# kind → (pid, thread id) → (ns the thread ran, ns it was runnable but waited for a core)
Scheduled = dict[str, dict[tuple[int, int], tuple[int, int]]]


@dataclass(frozen=True)
class Snapshot:
    processes: Sample
    own_seconds: float  # this process: the load generator and the latency reader
    machine_busy_ticks: int  # every CPU's time not idle, whoever spent it
    at: float
    scheduled: Scheduled  # every process, as KINDS, "load" (this process) and "other"


def _machine_busy_ticks() -> int:
    # /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ...
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def _scheduled_all(processes: Sample) -> Scheduled:
    """Every thread's ns on a CPU and ns runnable but waiting for one (/proc's schedstat:
    run, wait, timeslices), by kind as ``processes`` (a ``sample`` just taken) classed them,
    this process as "load", the rest "other"; threads the kernel keeps no figures for are
    left out."""
    kind_of = {pid: kind for kind, pids in processes.items() for pid in pids}
    out: Scheduled = {}
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        kind = "load" if pid == own else kind_of.get(pid, "other")
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # the process ended
        for task in tasks:
            try:
                run, wait = (task / "schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue  # the thread ended, or no schedstat in this kernel
            if run != "0" or wait != "0":
                out.setdefault(kind, {})[(pid, int(task.name))] = (int(run), int(wait))
    return out


def snapshot(worker_pid: int) -> Snapshot:
    own = os.times()
    processes = sample(worker_pid)
    return Snapshot(processes, own.user + own.system, _machine_busy_ticks(),
                    time.monotonic(), _scheduled_all(processes))


def cores(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Cores kept busy on average between two snapshots: per process kind, ``load`` (this
    process) and ``machine`` (all of it, out of ``os.cpu_count()``)."""
    seconds = max(after.at - before.at, 1e-9)
    out = {kind: round(_seconds(before.processes, after.processes, kind) / seconds, 2)
           for kind in KINDS}
    out["load"] = round((after.own_seconds - before.own_seconds) / seconds, 2)
    busy = after.machine_busy_ticks - before.machine_busy_ticks
    out["machine"] = round(busy / TICKS_PER_SECOND / seconds, 2)
    return out


def wait_per_run(before: Scheduled, after: Scheduled) -> dict[str, float]:
    """Per kind (and ``machine``, every process): ns its threads waited for a core per ns
    they ran between two readings. Thread by thread: one that started in between (or whose
    figures went back: its id reused) counts from zero; one that ended takes its figures
    with it. Empty where the kernel keeps no schedstat."""
    totals: dict[str, list[int]] = {}
    for kind, threads in after.items():
        ran = waited = 0
        for thread, (run, wait) in threads.items():
            run0, wait0 = before.get(kind, {}).get(thread, (0, 0))
            if run < run0 or wait < wait0:
                run0 = wait0 = 0
            ran += run - run0
            waited += wait - wait0
        totals[kind] = [ran, waited]
    if not totals:
        return {}
    totals["machine"] = [sum(t[0] for t in totals.values()), sum(t[1] for t in totals.values())]
    return {kind: round(waited / ran, 2) for kind, (ran, waited) in totals.items()
            if kind != "other" and ran > 0}


def waiting(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """``wait_per_run`` between two snapshots."""
    return wait_per_run(before.scheduled, after.scheduled)
