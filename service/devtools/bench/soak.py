"""``make soak``: hours of an ordinary day, shortened: does anything grow that should not?

One worker, purging itself every minute (``PAYAUTH_PURGE_INTERVAL_SECONDS``) with a retention
window of minutes (``SOAK_RETENTION_MINUTES``, 5) over a dedup store of periods of half the
window (the purge drops whole periods, as at a bank's with a day's), takes a steady load of
purchases on cards with a daily and a monthly limit each (never reached: every purchase
counted twice, its charges purged with its period) at half the rate it drains a backlog of
them at (measured first, on the same worker) for ``SOAK_MINUTES`` (30; hours are a
setting). The load is sent in steps of ``SOAK_STEP_SECONDS`` (60); after each, the step's
p50 and p99 (produce → result event, ``paced.PacedLoad``), the worker's resident memory,
the dedup store's size and the limits' charges' (every period's partition of each, indexes
and all), and the longest statement the database ran in it (``activity.LongestStatement``:
what holds a core for seconds is named) are kept. At the end, ``payauth verify`` on the
database (each limit's usage its charges and what the purges took of them, exactly, among
its checks).

What it answers (``summarize``): the p99 and the memory of the last five minutes against the
first five (the median of the steps' p99 in each, the mean of the memory: within 1.2 times); the
store's size, and the charges', over the last five minutes against the five once they could
first be full (the window, two periods and a purge interval after the start: within 1.2
times, "flat"); the longest statement (reported, not held to a bound); how many
periods the purge dropped; and verify's verdict. JSON to ``SOAK_OUT`` (.soak/results.json).
Topics keep ten minutes of messages, and the worker's log (INFO, as in production) is read
for failed purges and deferred periods (reported, not held against it) and removed: a soak
of hours does not fill the disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr

from service.config import load_settings
from service.devtools.bench import activity, paced
from service.devtools.bench.run import FULL, PARTITIONS, Bench, log
from service.devtools.chaos.purges import dedup_period_seconds
from service.devtools.processes import ROOT, WorkerProcess
from service.ops.topics import NewTopic
from service.ops.verify import report, verify

WINDOW_MINUTES = 5.0  # the first and the last stretch compared
BOUND = 1.2
BACKLOG = 60_000  # the drain rate's backlog
PURGE_INTERVAL_SECONDS = 60


@dataclass(frozen=True)
class Sample:
    minute: float  # when the step ended, from the start of the load
    rate_per_s: float
    samples: int
    missing: int
    p50_ms: float
    p99_ms: float
    rss_mb: float
    store_bytes: int
    periods: list[str]
    charges_bytes: int
    longest_statement_s: float
    longest_statement: str


# Each answer held to BOUND: its name, the figure before and the figure after.
_RATIOS = (("ratio_p99_last_vs_first", "p99_ms_first", "p99_ms_last"),
           ("ratio_rss_last_vs_first", "rss_mb_first", "rss_mb_last"),
           ("ratio_store_last_vs_settled", "store_mb_settled", "store_mb_last"),
           ("ratio_charges_last_vs_settled", "charges_mb_settled", "charges_mb_last"))


def _mean_mb(steps: list[Sample], size: Callable[[Sample], int]) -> float | None:
    return statistics.fmean(size(s) for s in steps) / 2**20 if steps else None


def summarize(samples: list[Sample], *, retention_minutes: float, period_minutes: float
              ) -> dict[str, Any]:
    """The soak's answers from its steps (in time order)."""
    end = samples[-1].minute
    first = [s for s in samples if s.minute <= WINDOW_MINUTES]
    last = [s for s in samples if s.minute > end - WINDOW_MINUTES]
    full_from = retention_minutes + 2 * period_minutes + PURGE_INTERVAL_SECONDS / 60
    settled = [s for s in samples if full_from < s.minute <= full_from + WINDOW_MINUTES]
    seen: set[str] = set()
    for s in samples:
        seen |= set(s.periods)
    dropped = seen - set(samples[-1].periods)
    out: dict[str, Any] = {
        "minutes": round(end, 1),
        "messages": sum(s.samples for s in samples),
        "missing": sum(s.missing for s in samples),
        "periods_dropped": len(dropped),
        "p99_ms_first": statistics.median(s.p99_ms for s in first) if first else None,
        "p99_ms_last": statistics.median(s.p99_ms for s in last),
        "rss_mb_first": statistics.fmean(s.rss_mb for s in first) if first else None,
        "rss_mb_last": statistics.fmean(s.rss_mb for s in last),
        "store_mb_settled": _mean_mb(settled, lambda s: s.store_bytes),
        "store_mb_last": _mean_mb(last, lambda s: s.store_bytes),
        "charges_mb_settled": _mean_mb(settled, lambda s: s.charges_bytes),
        "charges_mb_last": _mean_mb(last, lambda s: s.charges_bytes),
    }
    longest = max(samples, key=lambda s: s.longest_statement_s)
    out["longest_statement_s"] = round(longest.longest_statement_s, 1)
    out["longest_statement"] = longest.longest_statement
    out["longest_statement_minute"] = round(longest.minute, 1)
    for name, before, after in _RATIOS:
        out[name] = (round(out[after] / out[before], 3)
                     if out[before] not in (None, 0) else None)
    return out


def met(summary: dict[str, Any]) -> bool:
    ratios = [summary[name] for name, _, _ in _RATIOS]
    return (all(r is not None and r <= BOUND for r in ratios)
            and summary["periods_dropped"] > 0 and summary["missing"] == 0)


_PARTITIONS = """
SELECT i.inhparent::regclass::text AS parent, c.relname, pg_total_relation_size(c.oid) AS bytes
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent IN ('processed_transactions'::regclass, 'limit_charges'::regclass)
"""


async def _store(dsn: str) -> tuple[int, list[str], int]:
    """The dedup store's bytes and partitions, and the limits' charges' bytes."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(_PARTITIONS)
    finally:
        await conn.close()
    store = [r for r in rows if r["parent"] == "processed_transactions"]
    return (sum(int(r["bytes"]) for r in store), sorted(r["relname"] for r in store),
            sum(int(r["bytes"]) for r in rows if r["parent"] == "limit_charges"))


async def _set_period(dsn: str, seconds: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.fetch("SELECT * FROM payauth_dedup_set_period($1)", seconds)
    finally:
        await conn.close()


def _rss_mb(worker: WorkerProcess) -> float:
    assert worker.proc is not None
    status = Path(f"/proc/{worker.proc.pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def _counts(worker: WorkerProcess, *events: str) -> dict[str, int]:
    """Lines of each of ``events`` in the worker's log, read a line at a time (hours of a
    batch's decisions a line: too much to parse whole); the log is removed after."""
    needles = {event: f'"event":"{event}"' for event in events}
    counts = dict.fromkeys(events, 0)
    with worker.log_path.open(errors="replace") as lines:
        for line in lines:
            for event, needle in needles.items():
                counts[event] += needle in line
    worker.log_path.unlink()
    return counts


def _topic(bench: Bench, name: str) -> str:
    """An input topic and its output and dead-letter topics, keeping ten minutes."""
    full = f"bench.{bench.run}.{name}"
    names = [full, full + ".out", full + ".dlq"]
    admin = AdminClient({"bootstrap.servers": bench.bootstrap})  # kept until they answer
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1,
                  config={"retention.ms": "600000"}) for n in names])
    for future in futures.values():
        future.result()
    bench.topics += names
    return full


def _steps(bench: Bench, load: paced.PacedLoad, worker: WorkerProcess,
           longest: activity.LongestStatement, rate: float, minutes: float,
           step_seconds: float) -> list[Sample]:
    """The steady load in steps for ``minutes``, each step's sample kept and logged."""
    samples: list[Sample] = []
    started = time.monotonic()
    while time.monotonic() - started < minutes * 60:
        step = load.step(rate, step_seconds)
        size, periods, charges = asyncio.run(_store(bench.dsn))
        seconds, statement = longest.take()
        sample = Sample((time.monotonic() - started) / 60, rate, step.samples,
                        step.missing, round(step.p50_ms, 1), round(step.p99_ms, 1),
                        round(_rss_mb(worker), 1), size, periods, charges,
                        round(seconds, 1), statement)
        samples.append(sample)
        log(f"{sample.minute:5.1f} min: p50 {sample.p50_ms:.1f} ms, p99 "
            f"{sample.p99_ms:.1f} ms, {sample.samples} events ({sample.missing} "
            f"missing), worker {sample.rss_mb:.0f} MB, store "
            f"{size / 2**20:.1f} MB in {len(periods)} partitions, charges "
            f"{charges / 2**20:.1f} MB; longest statement {seconds:.1f} s")
    return samples


def soak(bench: Bench, minutes: float, retention_minutes: float, step_seconds: float
         ) -> dict[str, Any]:
    period = dedup_period_seconds(retention_minutes * 60)
    asyncio.run(bench.prepare_db())
    asyncio.run(bench.seed_cards())
    asyncio.run(_set_period(bench.dsn, period))
    topic, group = _topic(bench, "soak"), f"bench-soak-{bench.run}"

    def on_cards(n: int, tag: str) -> list[tuple[str, bytes]]:
        """Purchases each on its account's card with the two limits (``seed_cards``)."""
        return bench.messages(n, tag=tag, cards="BK-")

    worker = bench.worker(topic, group, "soak", settings={
        "PAYAUTH_DEDUP_RETENTION_HOURS": str(retention_minutes / 60),
        "PAYAUTH_PURGE_INTERVAL_SECONDS": str(PURGE_INTERVAL_SECONDS),
        "PAYAUTH_DEDUP_TTL_SECONDS": str(int(retention_minutes * 60)),
    })
    try:
        bench.produce(topic, on_cards(BACKLOG, "D"))
        drain = bench.throughput(worker, group, topic, BACKLOG)
        rate = drain / 2
        log(f"drain rate {drain:,.0f} auth/s; the soak at {rate:,.0f} auth/s for "
            f"{minutes:.0f} min, a window of {retention_minutes:g} min, periods of {period} s")
        assert worker.proc is not None
        load = paced.PacedLoad(bench.bootstrap, topic, topic + ".out", PARTITIONS,
                               on_cards, name=f"soak-{bench.run}",
                               under_test=worker.proc.pid)
        longest = activity.LongestStatement(bench.dsn)
        longest.start()
        try:
            samples = _steps(bench, load, worker, longest, rate, minutes, step_seconds)
        finally:
            longest.close()
        load.close()
    finally:
        code = worker.terminate()
    # (A period deferred: its detach could not go on five times, the worker's purge left
    # it to the next one; reported, not a failure: a claim may have held the store.)
    counts = _counts(worker, "purge_failed", "purge_period_deferred")
    failed_purges = counts["purge_failed"]
    text, ok = report(asyncio.run(verify(bench.dsn)))
    print(text)
    summary = summarize(samples, retention_minutes=retention_minutes,
                        period_minutes=period / 60)
    summary |= {"drain_auth_per_s": round(drain, 1), "rate_auth_per_s": round(rate, 1),
                "period_seconds": period, "retention_minutes": retention_minutes,
                "purges_failed": failed_purges,
                "periods_deferred": counts["purge_period_deferred"], "worker_exit": code,
                "verify_ok": ok}
    summary["met"] = met(summary) and ok and code == 0 and failed_purges == 0
    return {"summary": summary, "steps": [asdict(s) for s in samples]}


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES", "30"))
    retention = float(os.environ.get("SOAK_RETENTION_MINUTES", "5"))
    step = float(os.environ.get("SOAK_STEP_SECONDS", "60"))
    out = Path(os.environ.get("SOAK_OUT", str(ROOT / ".soak/results.json")))
    if minutes < 2 * WINDOW_MINUTES or retention < 1:
        print(f"soak: SOAK_MINUTES must be at least {2 * WINDOW_MINUTES:g} (two stretches "
              f"compared) and SOAK_RETENTION_MINUTES at least 1")
        return 2
    settings = load_settings()
    settings = settings.model_copy(update={"redis_url": SecretStr(
        settings.redis_url.get_secret_value())})
    out.parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(settings, FULL, out, "INFO", phases=frozenset())
    try:
        result = soak(bench, minutes, retention, step)
    finally:
        bench.cleanup()
    out.write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    print(json.dumps(s, indent=2))
    print(f"soak: {'met' if s['met'] else 'NOT met'} (ratios within {BOUND}, periods dropped, "
          f"nothing missing, verify clean)")
    return 0 if s["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
