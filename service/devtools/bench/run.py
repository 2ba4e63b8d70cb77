"""``make bench``: what one worker achieves, as ratios against baselines measured in the same
run on the same machine (absolute numbers on a shared 2-core machine mean little alone).

Over 400 lines: one phase after another over one shared fresh world (database, topics,
accounts); read top to bottom, it is the report's table in order. (The naive baseline, the
paced load, the relay, pgbench, the picture, the scratch world and the worker processes
live in modules of their own.)

Phases, each on its own topic/group in one fresh database with 10,000 accounts:
  pgbench     the worker's own statement for one authorization, 8 clients (one commit per
              authorization: the baseline batching beats)
  raw         a bare confluent-kafka consumer over the input topic (Kafka's limit)
  new         one worker over a backlog of new authorizations, 12 partitions
  replay      the same backlog again after `payauth replay --to-earliest`: all duplicates
              (three times; the median counts)
  db limit    pgbench of the worker's statement with batches of the size the worker formed
              over the backlog, as many clients as it keeps batches in flight (``pgbench.py``)
  lifecycle   backlogs of holds with their endings: authorizations, then clearings, partial
              reversals and clearings, full reversals, increments, split clearings, holds
              abroad and partial approvals (``lifecycle.py``), and of purchases of the same
              size, ABBA, one worker each; the holds' mean rate against the purchases'
              (``ratio_lifecycle_vs_purchase``) and against the backlog's
              (``ratio_lifecycle_vs_backlog``)
  limits      purchases, each account's on its card, four backlogs of half the backlog's
              size: on cards without limits, with a daily and a monthly limit each (none
              reached), with, without (ABBA), one worker each; the mean rate with limits
              against the mean without (``ratio_limits_vs_plain``): what the controls cost
  purge       a dedup store of `purge_records` past the window over five days (the
              window's own records beside them), ``payauth purge`` timed, against a tenth
              of them (``ratio_purge_10x_rows``: its cost must not grow with the rows;
              ``ratio_purge_10x_rows_in_store`` without the file system's freeing);
              then half the backlog decided alone and while such a purge runs, ABBA
              (``ratio_during_purge``) (``purge.py``)
  hot         every authorization on one account
  latency     paced at 70 % of `new` after a warm-up: produce → result event, p50/p99; then
              50 %, 25 % and 5 % (the curve); then the sustainable rate, the highest whose
              p99 stays within 100 ms over the window (``paced.py``); each step with the
              cores busy while it sent (``cpu.cores``) and how long each kind of process
              waited for a core (``cpu.waiting``)
  floor       the same paced loads through a bare relay (``relay.py``): Kafka's own latency
              at 5 % and 25 % and at the sustainable rate
  naive       the seed's flow, message by message (the baseline to beat)
and then `payauth verify`. Writes JSON to $BENCH_OUT (default .bench/results.json) and
``latency.png`` beside it (``plot.py``).

    BENCH_MODE=smoke  a small, quick run that only keeps the benchmark working (CI)
    BENCH_PHASES=new,db_limit,lifecycle   only these phases (the backlog always runs), e.g.
                      to compare two versions of the code on what a change touches
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import asyncpg
import redis
from confluent_kafka import Consumer, Producer
from pydantic import SecretStr

from service.adapters.kafka.admin import group_lag
from service.config import Settings, load_settings
from service.devtools import scratch
from service.devtools.bench import cpu, lifecycle, paced, pgbench, plot, purge
from service.devtools.bench.naive import run_naive
from service.devtools.network_message import authorization_message
from service.devtools.processes import ROOT, WorkerProcess
from service.ops.replay import build_plan, execute
from service.ops.verify import report, verify

PARTITIONS = 12
ACCOUNTS = 10_000
SUSTAINABLE_P99_MS = 100.0


@dataclass(frozen=True)
class Sizes:
    new: int
    lifecycle: int  # messages (whole holds: a few more at most)
    hot: int
    naive: int
    latency_seconds: float
    latency_warmup_seconds: float
    pgbench_seconds: int
    replays: int
    refinements: int  # bisections of the sustainable rate
    purge_records: int  # past the window, for the purge phase


FULL = Sizes(new=200_000, lifecycle=100_000, hot=30_000, naive=3_000, latency_seconds=30,
             latency_warmup_seconds=5, pgbench_seconds=20, replays=3, refinements=2,
             purge_records=5_000_000)
SMOKE = Sizes(new=3_000, lifecycle=3_000, hot=1_000, naive=200, latency_seconds=4,
              latency_warmup_seconds=1, pgbench_seconds=3, replays=1, refinements=0,
              purge_records=20_000)


# Each ratio: the two results it divides (computed when both phases ran), its digits.
RATIOS = {
    "ratio_vs_pgbench": ("new_auth_per_s", "pgbench_one_auth_per_call_tps", 3),
    "ratio_vs_db_limit": ("new_auth_per_s", "db_limit_auth_per_s", 3),
    "ratio_vs_naive": ("new_auth_per_s", "baseline_naive_auth_per_s", 2),
    "ratio_replay_vs_raw": ("replay_dups_per_s", "raw_consume_per_s", 3),
    "ratio_hot_vs_uniform": ("hot_account_auth_per_s", "new_auth_per_s", 3),
    "ratio_lifecycle_vs_purchase": ("lifecycle_auth_per_s", "lifecycle_purchases_auth_per_s", 3),
    "ratio_lifecycle_vs_backlog": ("lifecycle_auth_per_s", "new_auth_per_s", 3),
    "ratio_limits_vs_plain": ("limits_auth_per_s", "limits_plain_auth_per_s", 3),
    "ratio_during_purge": ("purge_during_auth_per_s", "purge_alone_auth_per_s", 3),
    "ratio_purge_10x_rows": ("purge_seconds", "purge_tenth_seconds", 2),
    # (The same without the file system's freeing of the dropped files: PostgreSQL's part.)
    "ratio_purge_10x_rows_in_store": ("purge_in_store_seconds", "purge_tenth_in_store_seconds",
                                      2),
}
# The phases, in order; BENCH_PHASES picks some (the backlog of new authorizations always
# runs: the others are held against it).
PHASES = ("pgbench", "raw", "new", "replay", "db_limit", "lifecycle", "limits", "purge",
          "hot", "latency", "floor", "naive")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def account_id(i: int) -> str:
    return f"BA-{i:05d}"


class Bench:
    def __init__(self, settings: Settings, sizes: Sizes, out: Path, log_level: str, *,
                 phases: frozenset[str] = frozenset(PHASES)) -> None:
        self.settings = settings
        self.sizes = sizes
        self.phases = phases
        self.out = out
        self.log_level = log_level
        self.run = uuid.uuid4().hex[:6]
        self.database = f"payauth_bench_{self.run}"
        self.dsn = scratch.admin_dsn(settings.database_url.get_secret_value(), self.database)
        self.bootstrap = settings.kafka_bootstrap_servers
        self.redis_url = settings.redis_url.get_secret_value()
        self.rng = random.Random(42)
        self.results: dict[str, Any] = {}
        self.topics: list[str] = []
        # The curve's steps (70 % to 5 % of the backlog rate): set by the latency phase; the
        # floor's relay is measured again at the 5 % and 25 % ones.
        self.curve: dict[str, paced.Step] = {}

    # ------------------------------------------------------------ preparation
    def topic(self, name: str) -> str:
        """An input topic with its output and dead-letter topics."""
        full = f"bench.{self.run}.{name}"
        names = [full, full + ".out", full + ".dlq"]
        scratch.create_topics(self.bootstrap, {n: PARTITIONS for n in names})
        self.topics += names
        return full

    async def prepare_db(self) -> None:
        await scratch.create_database(self.dsn, self.database)
        await self.seed([(account_id(i), Decimal("1000000000")) for i in range(ACCOUNTS)],
                        analyze=True)

    def messages(self, n: int, *, hot: bool = False, tag: str = "N", cards: str = "",
                 rng: random.Random | None = None) -> list[tuple[str, bytes]]:
        """``cards``: a prefix: each message names its account's card, the prefix and the
        account's number. ``rng``: the values drawn from it (the run's, by default)."""
        rng = rng or self.rng
        out = []
        for i in range(n):
            number = 0 if hot else rng.randrange(ACCOUNTS)
            acc = account_id(number)
            card = {"card_id": f"{cards}{number:05d}"} if cards else {}
            # A letter before the number: a run id ending in digits would otherwise make a
            # 13-digit run that sends every message through the card-number scan (about one
            # run in seven), a cost the next run would not have.
            txn = f"B{tag}-{self.run}-T{i:08d}"
            amount = f"{rng.randint(1, 10_000) / 100:.2f}"
            out.append((acc, json.dumps(authorization_message(txn, account_id=acc,
                                                              amount=amount, **card)).encode()))
        return out

    def records(self, n: int, tag: str) -> list[tuple[str, bytes]]:
        return self.messages(n, tag=tag)

    def produce(self, topic: str, records: list[tuple[str, bytes]]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20,
                             "enable.idempotence": True, "compression.type": "lz4",
                             "batch.num.messages": 10000})
        for key, value in records:
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0, "backlog not fully produced"

    # --------------------------------------------------------------- workers
    def worker(self, topic: str, group: str, name: str, *,
               settings: dict[str, str] | None = None) -> WorkerProcess:
        """``settings``: PAYAUTH_* variables of this worker's, over the bench's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAYAUTH_")}
        env.update({
            "PAYAUTH_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "PAYAUTH_GROUP_ID": group,
            "PAYAUTH_INPUT_TOPIC": topic, "PAYAUTH_OUTPUT_TOPIC": topic + ".out",
            "PAYAUTH_DLQ_TOPIC": topic + ".dlq", "PAYAUTH_DATABASE_URL": self.dsn,
            "PAYAUTH_REDIS_URL": self.redis_url, "PAYAUTH_METRICS_PORT": "0",
            "PAYAUTH_LOG_LEVEL": self.log_level, "PAYAUTH_COMMIT_INTERVAL_MS": "200",
            "PAYAUTH_PURGE_INTERVAL_SECONDS": "0",
            # An hour is plenty for the replay minutes later, and a run does not leave half
            # a million entries in the local Redis for a day.
            "PAYAUTH_DEDUP_TTL_SECONDS": "3600",
        })
        env.update(settings or {})
        # Worker settings to try, e.g. BENCH_WORKER_ENV="PAYAUTH_MAX_BATCH_SIZE=1000".
        for pair in os.environ.get("BENCH_WORKER_ENV", "").split():
            variable, _, value = pair.partition("=")
            env[variable] = value
        return WorkerProcess(env, self.out.parent / f"logs-{self.run}" / f"{name}.log").start()

    def uncommitted(self, group: str, topic: str) -> int:
        return sum(group_lag({"bootstrap.servers": self.bootstrap}, group, topic).values())

    def throughput(self, worker: WorkerProcess, group: str, topic: str, total: int,
                   timeout: float = 900) -> float:
        """Sustained messages/s: the worker's own count, sampled every 200 ms (a scrape costs
        the worker CPU), between the moments it passed 10 % and 90 % of the backlog, each
        found by interpolating between the samples around it; then wait until every offset
        is committed (the run only counts once the work is durable, end to end)."""
        marks: dict[float, float] = {}
        previous: tuple[float, float] | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(marks) < 2:
            try:
                done = sum(v for k, v in worker.metrics().items()
                           if k.startswith("payauth_messages_total"))
            except Exception:
                done = 0  # still starting
            now = time.monotonic()
            for fraction in (0.1, 0.9):
                target = fraction * total
                if fraction not in marks and done >= target:
                    if previous is not None and done > previous[1]:
                        then, before = previous
                        now_at = then + (now - then) * (target - before) / (done - before)
                        marks[fraction] = now_at
                    else:
                        marks[fraction] = now
            previous = (now, done)
            time.sleep(0.2)
        while self.uncommitted(group, topic):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not committed in {timeout} s")
            time.sleep(0.1)
        span = marks[0.9] - marks[0.1]
        if span < 0.5:
            log(f"note: {topic} took {span:.2f} s between 10 % and 90 %: too short to measure")
        return 0.8 * total / max(span, 0.05)

    @staticmethod
    def peak_rss_mb(worker: WorkerProcess) -> float:
        assert worker.proc is not None
        status = Path(f"/proc/{worker.proc.pid}/status").read_text()
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        return int(match.group(1)) / 1024 if match else float("nan")

    # --------------------------------------------------------------- counters
    async def pg_commits(self) -> int:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))
        finally:
            await conn.close()

    def redis_calls(self) -> int:
        stats = cast(dict[str, dict[str, Any]],
                     redis.Redis.from_url(self.redis_url).info("commandstats"))
        return sum(int(v["calls"]) for v in stats.values())

    # ----------------------------------------------------------------- phases
    def phase_pgbench(self) -> None:
        script = self.out.parent / "pgbench_one_authorization.sql"
        script.write_text(pgbench.script(1, ACCOUNTS))
        tps = pgbench.tps(self.dsn, script, clients=8, seconds=self.sizes.pgbench_seconds)
        self.results["pgbench_one_auth_per_call_tps"] = round(tps, 1)
        log(f"pgbench, the worker's statement with one authorization a call, 8 clients: "
            f"{tps:,.0f} tps")

    def phase_db_limit(self) -> None:
        """The database's ceiling for the worker's statement as the worker calls it: batches
        of the mean size it formed over the backlog, as many clients as it keeps batches in
        flight (PAYAUTH_MAX_CONCURRENT_BATCHES)."""
        batch = max(1, round(self.results["backlog_batch_messages_mean"]))
        clients = self.settings.max_concurrent_batches
        script = self.out.parent / "pgbench_worker_batches.sql"
        script.write_text(pgbench.script(batch, ACCOUNTS))
        calls = pgbench.tps(self.dsn, script, clients=clients,
                            seconds=self.sizes.pgbench_seconds)
        limit = calls * batch
        self.results.update(db_limit_auth_per_s=round(limit, 1), db_limit_batch=batch,
                            db_limit_clients=clients)
        log(f"pgbench, the worker's statement with {batch} authorizations a call, {clients} "
            f"clients: {calls:,.1f} calls/s = {limit:,.0f} auth/s (the database's limit)")

    def phase_raw(self, topic: str, total: int) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"raw-{self.run}", "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        consumer.subscribe([topic])
        seen, started = 0, None
        while seen < total:
            batch = consumer.consume(1000, timeout=1.0)
            if batch and started is None:
                started = time.monotonic()
            seen += sum(1 for m in batch if m.error() is None)
        assert started is not None
        rate = seen / (time.monotonic() - started)
        consumer.close()
        self.results["raw_consume_per_s"] = round(rate, 1)
        log(f"raw confluent-kafka consumer: {rate:,.0f} msg/s")

    def phase_new_and_replay(self, topic: str, total: int, *, replays: bool = True) -> None:
        group = f"bench-{self.run}"
        commits, calls = asyncio.run(self.pg_commits()), self.redis_calls()
        worker = self.worker(topic, group, "new")
        assert worker.proc is not None
        worker.port()  # logged once imported, before it joins the group: the imports are
        cpu_before = cpu.sample(worker.proc.pid)  # not the backlog's CPU
        rate = self.throughput(worker, group, topic, total)
        self.results["cpu_us_per_auth"] = cpu.per_item(cpu_before, cpu.sample(worker.proc.pid),
                                                       total)
        time.sleep(1.5)  # statistics are flushed by backends about once a second
        commits = asyncio.run(self.pg_commits()) - commits
        calls = self.redis_calls() - calls
        self.results["new_auth_per_s"] = round(rate, 1)
        self.results["pg_commits_per_msg"] = round(commits / total, 4)
        self.results["redis_calls_per_msg"] = round(calls / total, 4)
        rss = self.peak_rss_mb(worker)
        seen = worker.metrics()
        self.results["backlog_batch_messages_mean"] = round(
            seen.get("payauth_batch_messages_sum", 0.0)
            / max(1.0, seen.get("payauth_batch_messages_count", 0.0)), 1)
        assert worker.terminate() == 0
        log(f"one worker, new authorizations: {rate:,.0f} auth/s "
            f"({commits / total:.3f} PostgreSQL commits and {calls / total:.3f} Redis calls "
            f"per message)")

        if not replays:
            self.results["worker_rss_mb"] = round(rss, 1)
            return
        # Replay: rewind the group, run the same backlog again; every message a duplicate.
        # Three times, and the median counts: a replay lasts seconds, and on a shared machine
        # one of them may meet a checkpoint or autovacuum of the rows just written.
        replay_settings = self.settings.model_copy(update={"group_id": group,
                                                           "input_topic": topic})
        rates, caught = [], {}
        for attempt in range(self.sizes.replays):
            time.sleep(7)  # let the group become empty before the rewind
            execute(replay_settings, build_plan(replay_settings, to_earliest=True))
            worker = self.worker(topic, group, f"replay-{attempt}")
            rates.append(self.throughput(worker, group, topic, total))
            rss = max(rss, self.peak_rss_mb(worker))
            caught = {k: v for k, v in worker.metrics().items()
                      if k.startswith('payauth_duplicates_total{layer="')}
            assert worker.terminate() == 0
        rate = statistics.median(rates)
        self.results["replay_dups_per_s"] = round(rate, 1)
        self.results["replay_runs_per_s"] = [round(r, 1) for r in rates]
        self.results["worker_rss_mb"] = round(rss, 1)
        log(f"replay, all duplicates: {rate:,.0f} msg/s, the median of "
            f"{', '.join(f'{r:,.0f}' for r in rates)} (last one: {caught}); "
            f"peak RSS {rss:.0f} MB")

    def drain(self, name: str, run: int, records: list[tuple[str, bytes]]
              ) -> tuple[float, dict[str, float]]:
        """One worker, the purchase backlog's settings, over ``records`` on a topic of its own:
        its rate (``throughput``) and its CPU per message."""
        topic = self.topic(f"{name}-{run}")
        self.produce(topic, records)
        group = f"bench-{name}-{run}-{self.run}"
        worker = self.worker(topic, group, f"{name}-{run}")
        assert worker.proc is not None
        worker.port()
        cpu_before = cpu.sample(worker.proc.pid)
        rate = self.throughput(worker, group, topic, len(records))
        used = cpu.per_item(cpu_before, cpu.sample(worker.proc.pid), len(records))
        assert worker.terminate() == 0
        return rate, used

    def abba(self, sides: tuple[str, str], records: Callable[[str, int], list[tuple[str, bytes]]]
             ) -> None:
        """``sides[0]``, ``sides[1]``, ``sides[1]``, ``sides[0]``, one worker each (``drain``):
        a machine that slows or speeds up during the phase weighs on both sides alike. Each
        side's rate and CPU per message are the means of its two runs (``<side>_auth_per_s``,
        ``<side>_runs_per_s``, ``<side>_cpu_us_per_auth``); ``records(side, run)`` gives a
        run its backlog."""
        rates: dict[str, list[float]] = {side: [] for side in sides}
        cpus: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for run, side in enumerate((sides[0], sides[1], sides[1], sides[0])):
            rate, used = self.drain(side, run, records(side, run))
            rates[side].append(rate)
            cpus[side].append(used)
            log(f"one worker, {side}: {rate:,.0f} msg/s")
        for side in sides:
            self.results[f"{side}_auth_per_s"] = round(statistics.mean(rates[side]), 1)
            self.results[f"{side}_runs_per_s"] = [round(r, 1) for r in rates[side]]
            self.results[f"{side}_cpu_us_per_auth"] = {
                kind: round(statistics.mean(c[kind] for c in cpus[side]), 1)
                for kind in cpus[side][0]}

    def phase_lifecycle(self) -> None:
        """Two backlogs of holds and their endings (``lifecycle.py``) and two of purchases of
        the same size, on the settled database, ABBA (``abba``): purchases, holds, holds,
        purchases; decided by ``payauth_authorize`` (the lifecycle's backlogs on its
        set-based route). ``ratio_lifecycle_vs_purchase`` is the holds' mean rate against
        the purchases' beside them, in the same state of the database and the machine;
        ``ratio_lifecycle_vs_backlog`` against the purchase backlog's on the fresh database
        at the run's start. Then every hold must have ended as its messages say: none
        active, a seventh reversed."""
        # Generators of their own: the phases after it draw the same values as without it.
        rng, purchases_rng = random.Random(27), random.Random(28)
        backlogs = [lifecycle.messages(self.sizes.lifecycle, rng, ACCOUNTS, account_id,
                                       prefix=f"BL{n}-{self.run}") for n in (1, 2)]
        asyncio.run(self.seed([thin for backlog in backlogs for thin in backlog.thin]))
        asyncio.run(self.settle())
        size = len(backlogs[0].records)

        def records(side: str, run: int) -> list[tuple[str, bytes]]:
            if side == "lifecycle":
                return backlogs[run - 1].records  # runs 1 and 2
            return self.messages(size, tag=f"LP{run}", rng=purchases_rng)

        self.abba(("lifecycle_purchases", "lifecycle"), records)
        self.results["lifecycle_cpu_us_per_msg"] = self.results.pop("lifecycle_cpu_us_per_auth")
        self.results["lifecycle_messages"] = sum(len(b.records) for b in backlogs)
        self.results["lifecycle_holds"] = asyncio.run(self.hold_states())
        self.results["lifecycle_day"] = asyncio.run(self.issuers_day())
        log(f"one worker, holds and their endings ({size:,} messages a run): "
            f"{self.results['lifecycle_auth_per_s']:,.0f} msg/s against purchases' "
            f"{self.results['lifecycle_purchases_auth_per_s']:,.0f}; CPU per message "
            f"{self.results['lifecycle_cpu_us_per_msg']} us; holds "
            f"{self.results['lifecycle_holds']}, of an issuer's day "
            f"{self.results['lifecycle_day']}")

    def phase_limits(self) -> None:
        """Purchases, each account's on its card: on cards without limits, then on cards with
        a daily and a monthly limit each, none reached (the messages are of one day), then
        with limits again and without again (ABBA, ``abba``); half the purchase backlog's
        size each time, one worker each, as over the backlog."""
        asyncio.run(self.seed_cards())
        asyncio.run(self.settle())
        size = self.sizes.new // 2
        prefixes = {"limits_plain": "BP-", "limits": "BK-"}
        self.abba(("limits_plain", "limits"), lambda side, run: self.messages(
            size, tag=f"{side[-1].upper()}{run}", cards=prefixes[side]))
        # Every purchase counted once in its card's daily limit (none was declined).
        self.results["limits_messages"] = 2 * size
        self.results["limits_counted"] = asyncio.run(self.counted_in_daily_limits())

    def phase_purge(self) -> None:
        """``payauth purge`` over a tenth of ``purge_records`` past the window, then over all
        of them, nothing else running; then half the backlog decided by one worker alone and
        while the purge of ``purge_records`` runs (from when it has decided a tenth of it),
        twice, ABBA (a store filled afresh before each pair), each side's rate the mean of
        its two."""
        big = self.sizes.purge_records
        timed: dict[str, tuple[float, float, int]] = {}
        for name, records in (("purge_tenth", big // 10), ("purge", big)):
            asyncio.run(purge.fill_past(self.dsn, records, name[-1].upper() + "F"))
            timed[name] = asyncio.run(purge.timed_purge(self.dsn))
        size = self.sizes.new // 2
        rates: dict[str, list[float]] = {"purge_alone": [], "purge_during": []}
        for pair, names in enumerate((("purge_alone", "purge_during"),
                                      ("purge_during", "purge_alone"))):
            asyncio.run(purge.fill_past(self.dsn, big, f"P{pair}"))
            for name in names:
                topic = self.topic(f"{name}-{pair}")
                self.produce(topic, self.messages(size, tag=f"{name[-1].upper()}G{pair}"))
                group = f"bench-{name}-{pair}-{self.run}"
                worker = self.worker(topic, group, f"{name}-{pair}")
                worker.port()
                during = None
                if name == "purge_during":
                    during = threading.Thread(target=self.purge_once_under_way,
                                              args=(worker, size))
                    during.start()
                rates[name].append(self.throughput(worker, group, topic, size))
                if during is not None:
                    during.join()
                assert worker.terminate() == 0
        for name, runs in rates.items():
            self.results[f"{name}_auth_per_s"] = round(statistics.mean(runs), 1)
            self.results[f"{name}_runs_per_s"] = [round(r, 1) for r in runs]
        for name, (seconds, files, removed) in timed.items():
            self.results[f"{name}_records"] = removed
            self.results[f"{name}_seconds"] = round(seconds, 3)
            self.results[f"{name}_files_freed_seconds"] = round(files, 3)
            self.results[f"{name}_in_store_seconds"] = round(seconds - files, 3)
        log(f"purge alone: {timed['purge'][2]:,} records in {timed['purge'][0]:.3f} s "
            f"({timed['purge'][1]:.3f} freeing files), {timed['purge_tenth'][2]:,} in "
            f"{timed['purge_tenth'][0]:.3f} s ({timed['purge_tenth'][1]:.3f}); half the "
            f"backlog alone {rates['purge_alone']} auth/s, during a purge "
            f"{rates['purge_during']}")

    def purge_once_under_way(self, worker: WorkerProcess, total: int) -> None:
        """Once ``worker`` has decided a tenth of ``total``: the purge, its time in the
        log."""
        while True:
            try:
                done = sum(v for k, v in worker.metrics().items()
                           if k.startswith("payauth_messages_total"))
            except Exception:
                done = 0
            if done >= 0.1 * total:
                seconds, files, removed = asyncio.run(purge.timed_purge(self.dsn))
                log(f"purge under way: {removed:,} records in {seconds:.3f} s ({files:.3f} "
                    f"freeing files)")
                return
            time.sleep(0.05)

    async def counted_in_daily_limits(self) -> int:
        conn = await asyncpg.connect(self.dsn)
        try:
            return int(await conn.fetchval(
                "SELECT coalesce(sum(count), 0) FROM limit_usage WHERE limit_id LIKE 'LD-%'"))
        finally:
            await conn.close()

    async def seed_cards(self) -> None:
        """Two cards per account: BP-n without limits, BK-n with a daily and a monthly
        limit that the phase never reaches."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.copy_records_to_table(
                "cards", columns=["card_id", "account_id"],
                records=[(f"{prefix}{i:05d}", account_id(i)) for i in range(ACCOUNTS)
                         for prefix in ("BP-", "BK-")])
            await conn.copy_records_to_table(
                "spending_limits", columns=["limit_id", "scope", "scope_id", "period",
                                            "max_amount", "max_count"],
                records=[(f"L{period[0]}-{i:05d}", "CARD", f"BK-{i:05d}", period,
                          Decimal("100000000"), 100_000) for i in range(ACCOUNTS)
                         for period in ("DAY", "MONTH")])
            await conn.execute("ANALYZE cards, spending_limits")
        finally:
            await conn.close()

    async def settle(self) -> None:
        """What the phases before left to do done before the next one measures: the tables
        they wrote vacuumed and analyzed, as autovacuum would have soon, and their pages
        written out (a checkpoint). The purchase backlog starts on a fresh database; a
        phase after the backlog, its replays and pgbench's hundreds of thousands of
        decisions would otherwise pay for their cleanup in its own CPU per message."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("VACUUM (ANALYZE)")
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()

    async def seed(self, accounts: list[tuple[str, Decimal]], *, analyze: bool = False
                   ) -> None:
        """Euro accounts with these balances (their opening balances too)."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.copy_records_to_table(
                "accounts", columns=["account_id", "balance", "opening_balance", "currency"],
                records=[(a, balance, balance, "EUR") for a, balance in accounts])
            if analyze:
                await conn.execute("ANALYZE")
        finally:
            await conn.close()

    async def issuers_day(self) -> dict[str, int]:
        """How many of the lifecycle phase's decisions were of an issuer's day."""
        conn = await asyncpg.connect(self.dsn)
        try:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE amount_approved < amount "
                "AND billing_currency IS NULL) AS partial, "
                "count(*) FILTER (WHERE authorization_type = 'INCREMENTAL' "
                "AND result = 'APPROVED') AS increments, "
                "count(*) FILTER (WHERE final = false) AS split, "
                "count(*) FILTER (WHERE billing_currency IS NOT NULL AND result = 'APPROVED') "
                "AS converted FROM processed_transactions")
        finally:
            await conn.close()
        assert row is not None  # an aggregate answers one row
        return {name: int(row[name]) for name in ("partial", "increments", "split",
                                                   "converted")}

    async def hold_states(self) -> dict[str, int]:
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch("SELECT state, count(*) AS n FROM holds GROUP BY state")
        finally:
            await conn.close()
        return {row["state"]: int(row["n"]) for row in rows}

    def phase_hot(self) -> None:
        topic = self.topic("hot")
        self.produce(topic, self.messages(self.sizes.hot, hot=True, tag="H"))
        group = f"bench-hot-{self.run}"
        worker = self.worker(topic, group, "hot")
        rate = self.throughput(worker, group, topic, self.sizes.hot)
        assert worker.terminate() == 0
        self.results["hot_account_auth_per_s"] = round(rate, 1)
        log(f"one hot account: {rate:,.0f} auth/s")

    def phase_latency(self) -> None:
        """Produce → result event under a steady load, through one worker: a warm-up (not
        measured), 70 % of the backlog rate (the figures of record), 50 %, 25 % and 5 % (the
        curve; at 5 % the processes wait less for a core, each step's ``waiting`` says how
        much); then the sustainable rate: the highest whose p99 stays within 100 ms over
        the window, found by stepping the rate (``paced.sustainable_rate``)."""
        topic = self.topic("lat")
        worker = self.worker(topic, f"bench-lat-{self.run}", "latency")
        ready = time.monotonic() + 60
        while not worker.events("partitions_assigned") and time.monotonic() < ready:
            time.sleep(0.1)
        assert worker.proc is not None
        load = paced.PacedLoad(self.bootstrap, topic, topic + ".out", PARTITIONS,
                               self.records, name=f"lat-{self.run}",
                               under_test=worker.proc.pid)
        full = self.results["new_auth_per_s"]
        seconds = self.sizes.latency_seconds
        load.step(0.7 * full, self.sizes.latency_warmup_seconds)
        curve = {}
        for name, fraction, duration in (("70%", 0.7, seconds), ("50%", 0.5, seconds / 2),
                                         ("25%", 0.25, seconds / 2), ("5%", 0.05, seconds / 2)):
            step = load.step(fraction * full, duration)
            curve[name] = step
            log(f"latency at {step.rate_per_s:,.0f} auth/s ({name} of the backlog rate): "
                f"p50 {step.p50_ms:.1f} ms, p99 {step.p99_ms:.1f} ms ({step.samples} events"
                f"{f', {step.missing} missing' if step.missing else ''}); cores busy "
                f"{step.cores}, waited for a core per unit run {step.waiting or '-'}")
        log(f"sustainable rate: p99 <= {SUSTAINABLE_P99_MS} ms over {seconds:.0f} s")
        best, tried = paced.sustainable_rate(
            load, 0.25 * full, p99_bound_ms=SUSTAINABLE_P99_MS, seconds=seconds,
            refinements=self.sizes.refinements, log=log)
        load.close()
        seen = worker.metrics()
        assert worker.terminate() == 0

        def mean(name: str, labels: str = "") -> float:
            count = seen.get(f"{name}_count{labels}", 0.0)
            return seen.get(f"{name}_sum{labels}", 0.0) / count if count else 0.0

        # Where a batch's time went over the whole phase, and how big batches were: the
        # worker's own histograms.
        self.results["latency_batch_messages_mean"] = round(mean("payauth_batch_messages"), 1)
        self.results["latency_batch_stage_ms_mean"] = {
            stage: round(1000 * mean("payauth_batch_stage_seconds", f'{{stage="{stage}"}}'), 2)
            for stage in ("parse", "redis", "validate", "postgres_lookup", "postgres_commit",
                          "publish")}
        record = curve["70%"]
        self.results.update(
            p50_ms=round(record.p50_ms, 2), p99_ms=round(record.p99_ms, 2),
            latency_rate_per_s=round(record.rate_per_s, 1), latency_samples=record.samples,
            latency_events_missing=sum(s.missing for s in curve.values()),
            latency_curve=[{"load": name, **step.as_json()} for name, step in curve.items()],
            latency_points=[s.as_json() for s in (*curve.values(), *tried)],
            sustainable_auth_per_s=round(best.rate_per_s, 1) if best else 0.0,
            sustainable_p99_ms=round(best.p99_ms, 2) if best else None,
            sustainable_steps=[s.as_json() for s in tried])
        # What held the rate: the cores busy at it and at the lowest rate tried beyond it
        # (the machine's whole CPU near os.cpu_count(): more cores, not fewer waits).
        beyond = [s for s in tried if not s.within(SUSTAINABLE_P99_MS)
                  and (best is None or s.rate_per_s > best.rate_per_s)]
        self.results["machine_cores"] = os.cpu_count()
        self.results["cores_at_sustainable"] = best.cores if best else {}
        self.results["cores_beyond_sustainable"] = (
            min(beyond, key=lambda s: s.rate_per_s).cores if beyond else {})
        self.results["ratio_sustainable_vs_backlog"] = round(
            self.results["sustainable_auth_per_s"] / full, 3)
        self.curve = curve
        log(f"sustainable: {self.results['sustainable_auth_per_s']:,.0f} auth/s "
            f"({self.results['ratio_sustainable_vs_backlog']:.2f} of the backlog rate); "
            f"cores busy there {self.results['cores_at_sustainable'] or '-'}, at the lowest "
            f"rate tried beyond it {self.results['cores_beyond_sustainable'] or '-'} "
            f"(of {self.results['machine_cores']})")

    def phase_floor(self) -> None:
        """The same steady loads through a bare relay (``bench/relay.py``: consume, produce,
        acknowledge, commit; no Redis, no PostgreSQL): Kafka's own latency on this machine,
        at 5 % and 25 % of the backlog rate and at the sustainable rate."""
        topic = self.topic("floor")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAYAUTH_")}
        env.update(PAYAUTH_KAFKA_BOOTSTRAP_SERVERS=self.bootstrap, PAYAUTH_LOG_LEVEL="WARNING")
        relay = subprocess.Popen(
            [sys.executable, "-m", "service.devtools.bench.relay", topic, topic + ".out",
             f"bench-floor-{self.run}"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert relay.stdout is not None and "ready" in relay.stdout.readline()
            load = paced.PacedLoad(self.bootstrap, topic, topic + ".out", PARTITIONS,
                                   self.records, name=f"floor-{self.run}",
                                   under_test=relay.pid)
            load.step(0.25 * self.results["new_auth_per_s"], self.sizes.latency_warmup_seconds)
            steps = {name: load.step(self.curve[name].rate_per_s, self.sizes.latency_seconds)
                     for name in ("5%", "25%")}
            if self.results["sustainable_auth_per_s"]:
                steps["sustainable"] = load.step(self.results["sustainable_auth_per_s"],
                                                 self.sizes.latency_seconds)
            load.close()
        finally:
            relay.terminate()
            relay.wait(30)
        ours = {"5%": self.curve["5%"].p99_ms, "25%": self.curve["25%"].p99_ms,
                "sustainable": self.results["sustainable_p99_ms"]}
        self.results["kafka_floor_p99_ms"] = {k: round(s.p99_ms, 2) for k, s in steps.items()}
        self.results["kafka_floor_points"] = [{"load": k, **s.as_json()} for k, s in steps.items()]
        self.results["ratio_p99_vs_floor"] = {
            k: round(ours[k] / s.p99_ms, 2) for k, s in steps.items()
            if ours[k] is not None and s.p99_ms > 0}
        for name, step in steps.items():
            log(f"Kafka floor at {step.rate_per_s:,.0f} auth/s ({name}): p50 "
                f"{step.p50_ms:.1f} ms, p99 {step.p99_ms:.1f} ms; payauth's p99 is "
                f"{self.results['ratio_p99_vs_floor'].get(name, float('nan')):.1f}x that; "
                f"waited for a core per unit run {step.waiting or '-'}")

    def phase_naive(self) -> None:
        topic = self.topic("naive")
        self.produce(topic, self.messages(self.sizes.naive, tag="V"))
        started = time.monotonic()
        done = asyncio.run(run_naive(bootstrap=self.bootstrap, topic=topic,
                                     output=topic + ".out", group=f"naive-{self.run}",
                                     dsn=self.dsn, redis_url=self.redis_url,
                                     expected=self.sizes.naive))
        rate = done / (time.monotonic() - started)
        self.results["baseline_naive_auth_per_s"] = round(rate, 1)
        log(f"naive per-message baseline: {rate:,.0f} auth/s")

    # -------------------------------------------------------------------- run
    def execute(self) -> int:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        log(f"run {self.run}: database {self.database}, {ACCOUNTS} accounts, "
            f"backlog {self.sizes.new}, worker log level {self.log_level}")
        asyncio.run(self.prepare_db())
        wanted = self.phases
        if "pgbench" in wanted:
            self.phase_pgbench()
        topic = self.topic("new")
        self.produce(topic, self.messages(self.sizes.new))
        if "raw" in wanted:
            self.phase_raw(topic, self.sizes.new)
        self.phase_new_and_replay(topic, self.sizes.new, replays="replay" in wanted)
        for phase in ("db_limit", "lifecycle", "limits", "purge", "hot", "latency", "floor",
                      "naive"):
            if phase in wanted:
                getattr(self, f"phase_{phase}")()
        text, ok = report(asyncio.run(verify(self.dsn)))
        r = self.results
        for ratio, (numerator, denominator, digits) in RATIOS.items():
            if numerator in r and denominator in r:
                r[ratio] = round(r[numerator] / r[denominator], digits)
        r["verify_ok"] = ok
        r["mode"] = "smoke" if self.sizes is SMOKE else "full"
        r["worker_log_level"] = self.log_level
        r["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        r["machine"] = {"cpus": os.cpu_count()}
        self.out.write_text(json.dumps(r, indent=2) + "\n")
        plot.draw(r, self.out.with_name("latency.png"))
        print(render(r))
        print(text)
        self.cleanup()
        return 0 if ok else 1

    def cleanup(self) -> None:
        if self.topics:
            scratch.delete_topics(self.bootstrap, self.topics)
        asyncio.run(scratch.drop_database(self.dsn, self.database))


TARGETS = {
    "new_auth_per_s": (">=", 5000), "ratio_vs_pgbench": (">=", 0.5),
    "ratio_vs_naive": (">=", 5), "replay_dups_per_s": (">=", 50_000),
    "ratio_replay_vs_raw": (">=", 0.5), "p99_ms": ("<=", 50),
    "ratio_hot_vs_uniform": (">=", 0.5), "pg_commits_per_msg": ("<=", 0.1),
    "redis_calls_per_msg": ("<=", 0.1), "worker_rss_mb": ("<=", 200),
    "ratio_sustainable_vs_backlog": (">=", 0.7), "ratio_vs_db_limit": (">=", 0.7),
    "ratio_p99_vs_floor_25": ("<=", 3), "ratio_lifecycle_vs_purchase": (">=", 0.8),
    "ratio_limits_vs_plain": (">=", 0.85), "ratio_during_purge": (">=", 0.9),
    "ratio_purge_10x_rows": ("<=", 2),
}


def render(r: dict[str, Any]) -> str:
    flat = {**r, "ratio_p99_vs_floor_25": r.get("ratio_p99_vs_floor", {}).get("25%")}
    lines = ["", f"{'metric':<30}{'value':>14}  {'target':>10}  ", "-" * 62]
    for key in ("new_auth_per_s", "sustainable_auth_per_s", "db_limit_auth_per_s",
                "baseline_naive_auth_per_s", "pgbench_one_auth_per_call_tps",
                "replay_dups_per_s", "raw_consume_per_s", "hot_account_auth_per_s",
                "lifecycle_purchases_auth_per_s", "lifecycle_auth_per_s",
                "limits_plain_auth_per_s", "limits_auth_per_s",
                "p50_ms", "p99_ms", "pg_commits_per_msg",
                "redis_calls_per_msg", "worker_rss_mb", "ratio_sustainable_vs_backlog",
                "ratio_vs_db_limit", "ratio_p99_vs_floor_25", "ratio_vs_pgbench", "ratio_vs_naive",
                "ratio_replay_vs_raw", "ratio_hot_vs_uniform", "ratio_lifecycle_vs_purchase",
                "ratio_lifecycle_vs_backlog", "ratio_limits_vs_plain", "ratio_during_purge",
                "ratio_purge_10x_rows", "ratio_purge_10x_rows_in_store"):
        value = flat.get(key)
        target = TARGETS.get(key)
        mark = ""
        if target and value is not None:
            op, bound = target
            met = value >= bound if op == ">=" else value <= bound
            mark = f"{op} {bound:<7}  {'met' if met else 'NOT met'}"
        shown = f"{value:>14,}" if value is not None else f"{'-':>14}"
        lines.append(f"{key:<30}{shown}  {mark}")
    cpu_us = r.get("cpu_us_per_auth", {})
    lines.append("cpu_us_per_auth               " + ", ".join(
        f"{kind} {value:,}" for kind, value in cpu_us.items())
        + "  (worker <= 35, postgres <= 40)")
    lines.append("lifecycle_cpu_us_per_msg      " + ", ".join(
        f"{kind} {value:,}" for kind, value in r.get("lifecycle_cpu_us_per_msg", {}).items())
        + "  (postgres <= 60)")
    for name in ("lifecycle_purchases", "limits_plain", "limits"):
        lines.append(f"{name + '_cpu_us_per_auth':<29} " + ", ".join(
            f"{kind} {value:,}" for kind, value in r.get(f"{name}_cpu_us_per_auth",
                                                          {}).items()))
    floor = r.get("kafka_floor_p99_ms", {})
    lines.append("kafka_floor_p99_ms            " + ", ".join(
        f"{k} {v:,}" for k, v in floor.items()))
    lines.append("ratio_p99_vs_floor            " + ", ".join(
        f"{k} {v:,}" for k, v in r.get("ratio_p99_vs_floor", {}).items()))
    # How long each kind of process waited for a core per unit it ran, at 25 %: payauth's
    # step, then the floor's at the same rate.
    def at_quarter(points: str) -> str:
        waited = next((p.get("waiting") for p in r.get(points, []) if p.get("load") == "25%"),
                      None)
        return ", ".join(f"{kind} {value}" for kind, value in waited.items()) if waited else "-"

    lines.append(f"waiting for a core at 25 %    payauth: {at_quarter('latency_curve')}; "
                 f"floor: {at_quarter('kafka_floor_points')}")
    return "\n".join(lines)


def main() -> int:
    mode = os.environ.get("BENCH_MODE", "full")
    out = Path(os.environ.get("BENCH_OUT", str(ROOT / ".bench/results.json")))
    settings = load_settings()
    settings = settings.model_copy(update={"redis_url": SecretStr(
        settings.redis_url.get_secret_value())})
    level = os.environ.get("BENCH_LOG_LEVEL", "INFO")
    phases = [p.strip() for p in os.environ.get("BENCH_PHASES", ",".join(PHASES)).split(",")
              if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        print(f"bench: BENCH_PHASES names unknown phases {unknown}; known: {', '.join(PHASES)}")
        return 2
    return Bench(settings, SMOKE if mode == "smoke" else FULL, out, level,
                 phases=frozenset(phases)).execute()


if __name__ == "__main__":
    sys.exit(main())
