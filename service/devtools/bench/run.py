"""``make bench``: what one worker achieves, as ratios against baselines measured in the same
run on the same machine (absolute numbers on a shared 2-core machine mean little alone).

Over 400 lines: one phase after another over one shared fresh world (database, topics,
accounts); read top to bottom, it is the report's table in order. (The naive baseline, the
scratch world and the worker processes live in modules of their own.)

Phases, each on its own topic/group in one fresh database with 10,000 accounts:
  pgbench     the worker's own statement for one authorization, 8 clients (the database's
              limit for it, one commit per authorization)
  raw         a bare confluent-kafka consumer over the input topic (Kafka's limit)
  new         one worker over a backlog of new authorizations, 12 partitions
  replay      the same backlog again after `payauth replay --to-earliest`: all duplicates
              (three times; the median counts)
  hot         every authorization on one account
  latency     paced at 70 % of `new` after a warm-up: produce → result event, p50/p99; then
              50 % and 25 % (the latency curve)
  naive       the seed's flow, message by message (the baseline to beat)
and then `payauth verify`. Writes JSON to $BENCH_OUT (default .bench/results.json).

    BENCH_MODE=smoke  a small, quick run that only keeps the benchmark working (CI)
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
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import asyncpg
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from pydantic import SecretStr

from service.adapters import postgres as sql
from service.adapters.kafka.admin import group_lag
from service.config import Settings, load_settings
from service.devtools import scratch
from service.devtools.bench import cpu
from service.devtools.bench.naive import run_naive
from service.devtools.demo import authorization_message
from service.devtools.processes import ROOT, WorkerProcess
from service.replay import build_plan, execute
from service.verify import report, verify

PARTITIONS = 12
ACCOUNTS = 10_000


@dataclass(frozen=True)
class Sizes:
    new: int
    hot: int
    naive: int
    latency_seconds: float
    latency_warmup_seconds: float
    pgbench_seconds: int
    replays: int


FULL = Sizes(new=200_000, hot=30_000, naive=3_000, latency_seconds=30, latency_warmup_seconds=5,
             pgbench_seconds=20, replays=3)
SMOKE = Sizes(new=3_000, hot=1_000, naive=200, latency_seconds=4, latency_warmup_seconds=1,
              pgbench_seconds=3, replays=1)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def account_id(i: int) -> str:
    return f"BA-{i:05d}"


class Bench:
    def __init__(self, settings: Settings, sizes: Sizes, out: Path, log_level: str) -> None:
        self.settings = settings
        self.sizes = sizes
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
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.copy_records_to_table(
                "accounts", columns=["account_id", "balance", "opening_balance", "currency"],
                records=[(account_id(i), Decimal("1000000000"), Decimal("1000000000"), "EUR")
                         for i in range(ACCOUNTS)])
            await conn.execute("ANALYZE")
        finally:
            await conn.close()

    def messages(self, n: int, *, hot: bool = False, tag: str = "N") -> list[tuple[str, bytes]]:
        out = []
        for i in range(n):
            acc = account_id(0 if hot else self.rng.randrange(ACCOUNTS))
            txn = f"B{tag}-{self.run}-{i:08d}"
            amount = f"{self.rng.randint(1, 10_000) / 100:.2f}"
            out.append((acc, json.dumps(authorization_message(txn, account_id=acc,
                                                              amount=amount)).encode()))
        return out

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
    def worker(self, topic: str, group: str, name: str) -> WorkerProcess:
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
        # Worker settings to try, e.g. BENCH_WORKER_ENV="PAYAUTH_MAX_BATCH_SIZE=1000".
        for pair in os.environ.get("BENCH_WORKER_ENV", "").split():
            name, _, value = pair.partition("=")
            env[name] = value
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
        script = self.out.parent / "pgbench_authorize.sql"
        script.write_text(pgbench_script())
        dsn = self.dsn.split("://", 1)[1]
        hostport, db = dsn.split("/", 1)
        host, port = hostport.rsplit(":", 1) if ":" in hostport else (hostport, "5432")
        user = host.split("@")[0] if "@" in host else None
        host = host.split("@")[-1]
        cmd = ["pgbench", "-n", "-M", "prepared", "-c", "8", "-j", "2",
               "-T", str(self.sizes.pgbench_seconds), "-f", str(script), "-h", host, "-p",
               port, db]
        if user:
            cmd += ["-U", user]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        found = re.search(r"tps = ([\d.]+)", result.stdout)
        if found is None:
            raise RuntimeError(f"pgbench printed no tps:\n{result.stdout}\n{result.stderr}")
        tps = float(found.group(1))
        self.results["pgbench_same_sql_tps"] = round(tps, 1)
        log(f"pgbench, the worker's SQL for one authorization: {tps:,.0f} tps")

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

    def phase_new_and_replay(self, topic: str, total: int) -> None:
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
        assert worker.terminate() == 0
        log(f"one worker, new authorizations: {rate:,.0f} auth/s "
            f"({commits / total:.3f} PostgreSQL commits and {calls / total:.3f} Redis calls "
            f"per message)")

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
        """Produce → result event, for paced load: a warm-up (not measured), then 70 % of
        the backlog rate (the figures of record), then 50 % and 25 % (the curve), all through
        one worker; each latency counts for the step its message was sent in."""
        topic = self.topic("lat")
        group = f"bench-lat-{self.run}"
        worker = self.worker(topic, group, "latency")
        worker_ready = time.monotonic() + 60
        while not worker.events("partitions_assigned") and time.monotonic() < worker_ready:
            time.sleep(0.1)
        full = self.results["new_auth_per_s"]
        seconds = self.sizes.latency_seconds
        steps = [("warm-up", 0.7, self.sizes.latency_warmup_seconds), ("70%", 0.7, seconds),
                 ("50%", 0.5, seconds / 2), ("25%", 0.25, seconds / 2)]
        sent: dict[str, tuple[float, str]] = {}  # transaction_id → (sent at, step)
        latencies: dict[str, list[float]] = {name: [] for name, _, _ in steps}
        received = 0
        stop = threading.Event()

        def receive() -> None:
            nonlocal received
            # Assigned, not subscribed: no group to join, so reading starts at once and the
            # first events are not measured late.
            consumer = Consumer({"bootstrap.servers": self.bootstrap,
                                 "group.id": f"lat-reader-{self.run}",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 5})
            consumer.assign([TopicPartition(topic + ".out", p, OFFSET_BEGINNING)
                             for p in range(PARTITIONS)])
            give_up = float("inf")
            while received < len(sent) or not stop.is_set():
                if stop.is_set() and give_up == float("inf"):
                    give_up = time.monotonic() + 30
                if time.monotonic() > give_up:
                    break
                # poll() returns on the first event; consume() would wait out its timeout
                # to fill a batch and add that wait to every latency measured.
                first = consumer.poll(0.2)
                batch = [first, *consumer.consume(1000, timeout=0)] if first else []
                now = time.monotonic()
                for msg in batch:
                    if msg.error() is None:
                        txn = json.loads(msg.value() or b"{}").get("transaction_id")
                        if txn in sent:
                            at, step = sent[txn]
                            latencies[step].append(now - at)
                            received += 1
            consumer.close()

        reader = threading.Thread(target=receive)
        reader.start()
        time.sleep(2)
        # A gateway batches its sends for a few milliseconds, as librdkafka does by default
        # (linger.ms 5); 0 would cost the broker, on the same two cores, a request per message.
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                             "enable.idempotence": True})
        for step, fraction, duration in steps:
            rate = fraction * full
            records = self.messages(int(rate * duration) + 1, tag=f"L{step[:2]}")
            ids = [json.loads(value)["body"]["transaction_id"] for _, value in records]
            started = time.monotonic()
            for i, (key, value) in enumerate(records):
                # Paced in 5 ms ticks: sleeping between small bursts keeps this process off
                # the CPU the worker needs (a busy wait would take a whole core of two).
                due = started + i / rate
                if (delay := due - time.monotonic()) > 0.005:
                    time.sleep(delay)
                sent[ids[i]] = (time.monotonic(), step)
                producer.produce(topic, key=key, value=value)
                producer.poll(0)
        producer.flush(30)
        stop.set()
        reader.join()
        seen = worker.metrics()
        assert worker.terminate() == 0

        def mean(name: str, labels: str = "") -> float:
            count = seen.get(f"{name}_count{labels}", 0.0)
            return seen.get(f"{name}_sum{labels}", 0.0) / count if count else 0.0

        # Where a batch's time went over the whole phase (all three loads), and how big batches
        # were: the worker's own histograms.
        self.results["latency_batch_messages_mean"] = round(mean("payauth_batch_messages"), 1)
        self.results["latency_batch_stage_ms_mean"] = {
            stage: round(1000 * mean("payauth_batch_stage_seconds", f'{{stage="{stage}"}}'), 2)
            for stage in ("parse", "redis", "validate", "postgres_lookup", "postgres_commit",
                          "publish")}
        curve = []
        for step, fraction, _ in steps[1:]:
            values = sorted(latencies[step])
            p50 = statistics.median(values) * 1000
            p99 = values[int(0.99 * (len(values) - 1))] * 1000
            curve.append({"load": step, "rate_per_s": round(fraction * full, 1),
                          "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                          "samples": len(values)})
            log(f"latency at {fraction * full:,.0f} auth/s ({step} of the backlog rate): "
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(values)} events)")
        record = curve[0]
        self.results.update(p50_ms=record["p50_ms"], p99_ms=record["p99_ms"],
                            latency_rate_per_s=record["rate_per_s"],
                            latency_samples=record["samples"], latency_curve=curve,
                            latency_events_missing=len(sent) - received)

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
        self.phase_pgbench()
        topic = self.topic("new")
        self.produce(topic, self.messages(self.sizes.new))
        self.phase_raw(topic, self.sizes.new)
        self.phase_new_and_replay(topic, self.sizes.new)
        self.phase_hot()
        self.phase_latency()
        self.phase_naive()
        text, ok = report(asyncio.run(verify(self.dsn)))
        r = self.results
        r["ratio_vs_pgbench"] = round(r["new_auth_per_s"] / r["pgbench_same_sql_tps"], 3)
        r["ratio_vs_naive"] = round(r["new_auth_per_s"] / r["baseline_naive_auth_per_s"], 2)
        r["ratio_replay_vs_raw"] = round(r["replay_dups_per_s"] / r["raw_consume_per_s"], 3)
        r["ratio_hot_vs_uniform"] = round(r["hot_account_auth_per_s"] / r["new_auth_per_s"], 3)
        r["verify_ok"] = ok
        r["mode"] = "smoke" if self.sizes is SMOKE else "full"
        r["worker_log_level"] = self.log_level
        r["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        r["machine"] = {"cpus": os.cpu_count()}
        self.out.write_text(json.dumps(r, indent=2) + "\n")
        print(render(r))
        print(text)
        self.cleanup()
        return 0 if ok else 1

    def cleanup(self) -> None:
        scratch.delete_topics(self.bootstrap, self.topics)
        asyncio.run(scratch.drop_database(self.dsn, self.database))


TARGETS = {
    "new_auth_per_s": (">=", 5000), "ratio_vs_pgbench": (">=", 0.5),
    "ratio_vs_naive": (">=", 5), "replay_dups_per_s": (">=", 50_000),
    "ratio_replay_vs_raw": (">=", 0.5), "p99_ms": ("<=", 50),
    "ratio_hot_vs_uniform": (">=", 0.5), "pg_commits_per_msg": ("<=", 0.1),
    "redis_calls_per_msg": ("<=", 0.1), "worker_rss_mb": ("<=", 200),
}


def render(r: dict[str, Any]) -> str:
    lines = ["", f"{'metric':<28}{'value':>14}  {'target':>10}  ", "-" * 60]
    for key in ("new_auth_per_s", "baseline_naive_auth_per_s", "pgbench_same_sql_tps",
                "replay_dups_per_s", "raw_consume_per_s", "hot_account_auth_per_s",
                "p50_ms", "p99_ms", "pg_commits_per_msg", "redis_calls_per_msg",
                "worker_rss_mb", "ratio_vs_pgbench", "ratio_vs_naive", "ratio_replay_vs_raw",
                "ratio_hot_vs_uniform"):
        value = r[key]
        target = TARGETS.get(key)
        mark = ""
        if target:
            op, bound = target
            met = value >= bound if op == ">=" else value <= bound
            mark = f"{op} {bound:<7}  {'met' if met else 'NOT met'}"
        lines.append(f"{key:<28}{value:>14,}  {mark}")
    cpu_us = r.get("cpu_us_per_auth", {})
    lines.append("cpu_us_per_auth             " + ", ".join(
        f"{kind} {value:,}" for kind, value in cpu_us.items()) + "  (worker <= 40)")
    return "\n".join(lines)


def pgbench_script() -> str:
    """The worker's own statement (``service.adapters.postgres``) for one authorization, with
    pgbench variables in place of the bind parameters."""
    txn = "ARRAY['pgb-' || :client_id || '-' || :n]"
    acct = "ARRAY['BA-' || lpad(:acct::text, 5, '0')]"
    values = {
        1: txn, 2: acct, 3: "ARRAY[1.00]", 4: "ARRAY['EUR']", 5: "ARRAY['PURCHASE']",
        6: "ARRAY['fp']", 7: "ARRAY['corr']", 8: "ARRAY['msg']", 9: "ARRAY[0]",
        10: "ARRAY[0]", 11: "now()", 12: "'pgbench'", 13: "gen_random_uuid()",
    }
    statement = sql.AUTHORIZE_STATEMENT
    for number in sorted(values, reverse=True):  # $13 before $1
        statement = statement.replace(f"${number}", values[number])
    return "\n".join([
        "\\set acct random(0, 9999)",
        "\\set n random(1, 2000000000)",
        " ".join(statement.split()) + ";",
        "",
    ])


def main() -> int:
    mode = os.environ.get("BENCH_MODE", "full")
    out = Path(os.environ.get("BENCH_OUT", str(ROOT / ".bench/results.json")))
    settings = load_settings()
    settings = settings.model_copy(update={"redis_url": SecretStr(
        settings.redis_url.get_secret_value())})
    level = os.environ.get("BENCH_LOG_LEVEL", "INFO")
    return Bench(settings, SMOKE if mode == "smoke" else FULL, out, level).execute()


if __name__ == "__main__":
    sys.exit(main())
