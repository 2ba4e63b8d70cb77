"""``make chaos``: a bounded, self-stopping fault-injection run with the invariant checker.

Over 400 lines: the fault catalogue (one small function per kind, two lanes) and the run's
supervision share the run's state; the generator, the checker, the TCP proxy and the
purges are modules of their own.

Three workers in one group on the local stack; a load generator with a ground-truth log
(purchases, refunds and declines, and lifecycles among them: holds, advices, reversals,
clearings, orphans; see lifecycles.py; half the purchases on cards with spending limits, and
verifications on a card frozen and thawed among the faults, cards.py); ``payauth holds
expire --execute`` every few seconds
while faults strike, two at once sometimes (expiry.py); two lanes of seeded, random faults
(workers: kill -9, kill -9 at the commit points, SIGTERM, SIGSTOP past the poll interval, a
member joining mid-batch, a planned rollback; services: Redis stopped/flushed/restarted,
PostgreSQL restarted/paused/unreachable, the Kafka broker restarted, ``payauth purge`` with
a retention window of minutes, so that redeliveries and lifecycles meet purged records;
purges.py; ``payauth cards status`` freezing or thawing a card). Then faults (and the
expiry runs) stop, the load runs on 15 s past the last one (a fault that ran late still
strikes under load), lag drains to zero, a last expiry run
publishes what the others left in its outbox, the checker runs, ``payauth replay --shadow
--to-earliest`` must find that deciding the whole stream again changes nothing, and a table
is printed. Exit 1 on any violation.

    CHAOS_SECONDS (default 240)  CHAOS_SEED (default 1)  CHAOS_RATE new transactions/s (100)
    CHAOS_FAULTS_PER_KIND (default max(5, CHAOS_SECONDS // 60))
    CHAOS_HOLD_EXPIRY_SECONDS (20): the run's PAYAUTH_HOLD_EXPIRY_HOURS, in seconds; a
      lifecycle's messages spread over twice that, so some holds expire midway
    CHAOS_ORPHAN_PURCHASE_REVERSALS (1): 0 sends no reversal of a purchase before it
    CHAOS_LIFECYCLE_SHARE (0.08): the share of the generator's steps that start a lifecycle
    CHAOS_MAX_BATCH_SIZE (unset: the worker's default): the workers' PAYAUTH_MAX_BATCH_SIZE
    CHAOS_RETENTION_SECONDS (120): the run's PAYAUTH_DEDUP_RETENTION_HOURS, in seconds
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from pydantic import SecretStr

from service.adapters.kafka.admin import group_lag
from service.adapters.kafka.config import client_config
from service.config import Settings, load_settings
from service.devtools import scratch
from service.devtools.chaos.checker import check, read_log
from service.devtools.chaos.expiry import ExpiryRuns
from service.devtools.chaos.gaps import CommitObserver, Gap, gaps_by_kind
from service.devtools.chaos.gaps import render as render_gaps
from service.devtools.chaos.generator import LoadGenerator, seed_accounts
from service.devtools.chaos.proxy import TcpProxy
from service.devtools.chaos.purges import Purges, dedup_period_seconds, shadow_replay
from service.devtools.processes import ROOT, WorkerProcess, free_port

STACK = ROOT / "deploy/local/stack.sh"
PARTITIONS = 12
LOAD_AFTER_FAULTS = 15.0  # seconds of load after the last fault has ended (see execute)


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class RedisServer:
    """A private redis-server for the run, so stopping it disturbs nobody else."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def flush(self) -> None:
        redis.Redis(port=self.port, socket_timeout=2).flushall()


class Supervisor:
    """Keeps three worker slots running (as an orchestrator would), scrapes their metrics."""

    def __init__(self, base_env: dict[str, str], log_dir: Path, *,
                 placements: list[tuple[tuple[str, ...], str]] | None = None) -> None:
        """``placements``: where each slot's workers run (see WorkerProcess); by default in
        this process's own network namespace."""
        self._env = base_env
        self._dir = log_dir
        self._placements = placements
        self._lock = threading.Lock()
        self.slots: list[WorkerProcess | None] = [None, None, None]
        self._held: set[int] = set()
        self._generation = 0
        self._last: dict[int, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def spawn(self, slot: int, **overrides: str) -> WorkerProcess:
        """A worker in ``slot`` (-1: an extra one, not kept running). Each slot's workers
        are one static member of the group, as the StatefulSet's pods are (their name is
        their ``group.instance.id``): a worker restarted in its slot takes its partitions
        back at once instead of the group waiting out the dead one's session."""
        if slot >= 0:
            overrides = {"PAYAUTH_GROUP_INSTANCE_ID": f"{self._env['PAYAUTH_GROUP_ID']}-{slot}",
                         **overrides}
        with self._lock:
            self._generation += 1
            placement = (self._placements[slot] if self._placements and slot >= 0
                         else ((), "127.0.0.1"))
            worker = WorkerProcess({**self._env, **overrides},
                                   self._dir / f"worker-{slot}-{self._generation}.log",
                                   placement=placement).start()
            if slot >= 0:
                self.slots[slot] = worker
            return worker

    @property
    def env(self) -> dict[str, str]:
        """The workers' environment (an operator command of the run takes it too)."""
        return dict(self._env)

    def hold(self, slot: int) -> None:
        self._held.add(slot)

    def release(self, slot: int) -> None:
        self._held.discard(slot)

    def start(self) -> None:
        for slot in range(len(self.slots)):
            self.spawn(slot)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for slot, worker in enumerate(self.slots):
                if worker is None or slot in self._held:
                    continue
                if worker.alive():
                    self.scrape(worker)
                else:
                    time.sleep(0.5)  # an orchestrator's restart delay
                    if slot not in self._held and not self._stop.is_set():
                        self.spawn(slot)
            self._stop.wait(1.0)

    def scrape(self, worker: WorkerProcess) -> None:
        with contextlib.suppress(Exception):  # starting, stopping or dying: keep the last
            self._last[id(worker)] = worker.metrics()

    def totals(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for sample in self._last.values():
            for name, value in sample.items():
                out[name] += int(value)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        workers = [w for w in self.slots if w is not None]
        for w in workers:
            self.scrape(w)
            w.signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait_exit(60)
            except subprocess.TimeoutExpired:
                w.kill()


class Chaos:
    def __init__(self, settings: Settings, seconds: float, seed: int, rate: float,
                 per_kind: int, out_dir: Path) -> None:
        self.settings = settings
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.seed = seed
        self.rate = rate
        self.per_kind = per_kind
        self.out = out_dir
        self.run = uuid.uuid4().hex[:6]
        self.faults: Counter[str] = Counter()
        self.fault_starts: list[tuple[str, float]] = []
        self.fault_spans: list[tuple[str, float, float]] = []  # (kind, began, ended)
        self.errors: list[str] = []
        self.stop_faults = threading.Event()
        self.database = f"payauth_chaos_{self.run}"
        self.dsn = scratch.admin_dsn(settings.database_url.get_secret_value(), self.database)
        self.topics = {n: f"chaos.{self.run}.{n}" for n in ("in", "out", "dlq")}
        self.group = f"chaos-{self.run}"
        self.pg_ours = _pg_is_ours()
        self.hold_expiry_seconds = float(os.environ.get("CHAOS_HOLD_EXPIRY_SECONDS", "20"))
        self.orphan_purchase_reversals = \
            os.environ.get("CHAOS_ORPHAN_PURCHASE_REVERSALS", "1") == "1"
        self.lifecycle_share = float(os.environ.get("CHAOS_LIFECYCLE_SHARE", "0.08"))
        self.retention_seconds = float(os.environ.get("CHAOS_RETENTION_SECONDS", "120"))
        self.expiry: ExpiryRuns | None = None
        self.kafka_ours = (ROOT / ".stack/kafka/kafka.pid").exists()

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        asyncio.run(scratch.create_database(
            self.dsn, self.database,
            dedup_period_seconds=dedup_period_seconds(self.retention_seconds)))
        scratch.create_topics(self.settings.kafka_bootstrap_servers, {
            self.topics["in"]: PARTITIONS, self.topics["out"]: PARTITIONS,
            self.topics["dlq"]: 3})
        self.redis = RedisServer(self.out)
        self.redis.start()
        pg_port = int(self.dsn.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        self.proxy = TcpProxy(pg_port)
        self.accounts = asyncio.run(seed_accounts(self.dsn, self.run))
        self.worker_settings = Settings(
            kafka_bootstrap_servers=self.settings.kafka_bootstrap_servers,
            group_id=self.group, input_topic=self.topics["in"],
            output_topic=self.topics["out"], dlq_topic=self.topics["dlq"],
            database_url=SecretStr(self.dsn),
            redis_url=SecretStr(f"redis://127.0.0.1:{self.redis.port}/0"),
        )
        proxied = self.dsn.replace(self.dsn.split("://", 1)[1].split("/", 1)[0],
                                   f"127.0.0.1:{self.proxy.port}")
        env = self.worker_env({
            "PAYAUTH_KAFKA_BOOTSTRAP_SERVERS": self.settings.kafka_bootstrap_servers,
            "PAYAUTH_DATABASE_URL": proxied,
            "PAYAUTH_REDIS_URL": f"redis://127.0.0.1:{self.redis.port}/0",
        })
        self.supervisor = Supervisor(env, self.out / "workers")
        self.purges = self.purges_with(env)

    def purges_with(self, env: dict[str, str]) -> Purges:
        """``payauth purge`` with the workers' settings ``env``, the database reached
        directly (not through the run's proxy)."""
        return Purges(self.dsn, {**env, "PAYAUTH_DATABASE_URL": self.dsn},
                      self.retention_seconds, self.out / "purges")

    def worker_env(self, where: dict[str, str]) -> dict[str, str]:
        """The workers' environment: ``where`` the services are, this run's names, and
        timeouts short enough for faults to show within seconds."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAYAUTH_")}
        env.update({
            "PAYAUTH_GROUP_ID": self.group,
            "PAYAUTH_INPUT_TOPIC": self.topics["in"],
            "PAYAUTH_OUTPUT_TOPIC": self.topics["out"],
            "PAYAUTH_DLQ_TOPIC": self.topics["dlq"],
            "PAYAUTH_REDIS_TIMEOUT_SECONDS": "0.3",
            "PAYAUTH_METRICS_PORT": "0",
            "PAYAUTH_LOG_LEVEL": "INFO",
            "PAYAUTH_SESSION_TIMEOUT_MS": "6000",
            "PAYAUTH_MAX_POLL_INTERVAL_MS": "10000",
            "PAYAUTH_COMMIT_INTERVAL_MS": "500",
            "PAYAUTH_DEDUP_TTL_SECONDS": "20",  # late replays outlive the fast path
            "PAYAUTH_STATEMENT_TIMEOUT_MS": "4000",
            "PAYAUTH_LOCK_TIMEOUT_MS": "2000",
            "PAYAUTH_SHUTDOWN_TIMEOUT_SECONDS": "15",
            "PAYAUTH_RETRY_BACKOFF_MAX_MS": "2000",
            "PAYAUTH_PURGE_INTERVAL_SECONDS": "0",
            "PAYAUTH_HOLD_EXPIRY_HOURS": repr(self.hold_expiry_seconds / 3600),
            "PAYAUTH_DEDUP_RETENTION_HOURS": repr(self.retention_seconds / 3600),
        })
        if os.environ.get("CHAOS_MAX_BATCH_SIZE"):
            env["PAYAUTH_MAX_BATCH_SIZE"] = os.environ["CHAOS_MAX_BATCH_SIZE"]
        env.update(where)
        return env

    # ----------------------------------------------------------------- faults
    def worker_faults(self) -> dict[str, Callable[[], None]]:
        sup = self.supervisor

        def victim() -> int:
            return self.rng.randrange(len(sup.slots))

        def kill() -> None:
            slot = victim()
            worker = sup.slots[slot]
            if worker is not None:
                worker.signal(signal.SIGKILL)

        def replace_victim(fault_point: str) -> tuple[int, WorkerProcess]:
            """Hold a random slot, kill its worker, start one there armed with a fault."""
            slot = victim()
            sup.hold(slot)
            worker = sup.slots[slot]
            if worker is not None:
                worker.kill()
            return slot, sup.spawn(slot, PAYAUTH_TEST_FAULT_POINT=fault_point)

        def kill_at(point: str) -> Callable[[], None]:
            def fault() -> None:
                slot, doomed = replace_victim(point)
                try:
                    doomed.wait_exit(30)  # dies by itself at the point, on its first batch
                except subprocess.TimeoutExpired:
                    doomed.kill()  # it got no work in time: a plain kill -9 then
                sup.release(slot)
            return fault

        def sigterm() -> None:
            slot = victim()
            sup.hold(slot)
            worker = sup.slots[slot]
            if worker is not None:
                try:
                    worker.terminate(30)
                except subprocess.TimeoutExpired:
                    self.errors.append("a worker did not stop within 30 s of SIGTERM")
                    worker.kill()
            sup.spawn(slot)
            sup.release(slot)

        def zombie() -> None:
            # stopped past its group session and poll interval, whatever the run gives them:
            # the group has expelled it and handed its partitions on when it wakes
            stopped = max(int(sup.env["PAYAUTH_SESSION_TIMEOUT_MS"]),
                          int(sup.env["PAYAUTH_MAX_POLL_INTERVAL_MS"])) / 1000 + 2
            worker = sup.slots[victim()]
            if worker is not None and worker.alive():
                worker.signal(signal.SIGSTOP)
                time.sleep(stopped)
                worker.signal(signal.SIGCONT)

        def join() -> None:
            extra = sup.spawn(-1)
            time.sleep(self.rng.uniform(3, 8))
            try:
                extra.terminate(30)
            except subprocess.TimeoutExpired:
                extra.kill()

        def rollback() -> None:
            slot, _ = replace_victim("rollback_once")
            sup.release(slot)

        return {
            "worker_kill": kill,
            "worker_kill_after_db_commit": kill_at("after_db_commit"),
            "worker_kill_after_publish": kill_at("after_publish"),
            "worker_sigterm": sigterm,
            "worker_sigstop_zombie": zombie,
            "worker_joins_mid_batch": join,
            "transaction_rolled_back": rollback,
        }

    def infra_faults(self) -> dict[str, Callable[[], None]]:
        def outage(begin: Callable[[], None], end: Callable[[], None],
                   longest: float) -> Callable[[], None]:
            """``begin``, then 2 to ``longest`` seconds (seeded), then ``end``."""
            def fault() -> None:
                begin()
                time.sleep(self.rng.uniform(2, longest))
                end()
            return fault

        def redis_restart() -> None:
            self.redis.stop()
            self.redis.start()

        faults: dict[str, Callable[[], None]] = {
            "redis_stopped": outage(self.redis.stop, self.redis.start, 6),
            "redis_flushed": self.redis.flush,
            "redis_restarted": redis_restart,
            "postgres_paused": outage(self.proxy.pause, self.proxy.resume, 6),
            "postgres_unreachable": outage(self.proxy.cut, self.proxy.restore, 5),
            "dedup_purged": self.purge,
            "card_status_changed": self.flip_card,
        }
        if self.pg_ours:
            faults["postgres_restarted"] = lambda: _stack("restart-postgres")
        if self.kafka_ours:
            faults["kafka_broker_restarted"] = lambda: _stack("restart-kafka")
        return faults

    def flip_card(self) -> None:
        """Freeze the toggled card, or thaw it (``payauth cards status``; cards.py)."""
        assert self.accounts.toggle is not None
        self.accounts.toggle.flip(self.dsn)
        if self.accounts.toggle.uncertain:
            self.errors.append("payauth cards status never answered")

    def purge(self) -> None:
        if self.purges.run_once() != 0:
            self.errors.append("a payauth purge run failed")

    def landed(self, kind: str) -> None:
        """A fault that looks before it strikes (which node leads, which is primary) calls
        this at the strike: its gap counts from here, not from its preparation."""
        for i in range(len(self.fault_starts) - 1, -1, -1):
            if self.fault_starts[i][0] == kind:
                self.fault_starts[i] = (kind, time.time())
                return

    def lane(self, name: str, faults: dict[str, Callable[[], None]], phase: float) -> None:
        """The faults of one lane in a seeded order, evenly spread over the run, each
        ``phase`` of an interval into its slot (the two lanes take 0.25 and 0.75: the first
        fault finds the workers at work, and the lanes do not strike at the same moment,
        so each gap is one fault's, unless a fault outlasts half an interval)."""
        schedule = [k for k in faults for _ in range(self.per_kind)]
        self.rng.shuffle(schedule)
        interval = self.seconds / max(1, len(schedule))
        started = time.monotonic()
        for i, kind in enumerate(schedule):
            wait = started + (i + phase) * interval - time.monotonic()
            if wait > 0 and self.stop_faults.wait(wait):
                return
            if self.stop_faults.is_set():
                return
            log(f"{name}: {kind}")
            began = time.time()
            self.fault_starts.append((kind, began))  # see landed()
            try:
                faults[kind]()
                self.faults[kind] += 1
            except Exception as exc:
                self.errors.append(f"fault {kind} failed: {exc!r}")
                log(f"fault {kind} failed: {traceback.format_exc(limit=2)}")
            finally:
                self.fault_spans.append((kind, began, time.time()))

    # -------------------------------------------------------------------- run
    def execute(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        log(f"run {self.run}: {self.seconds:.0f} s, seed {self.seed}, {self.rate:.0f} txn/s, "
            f"{self.per_kind} fault(s) of each kind; artifacts in {self.out}")
        self.setup()
        self.supervisor.start()
        observer = CommitObserver(client_config(self.worker_settings), self.group,
                                  self.topics["in"], PARTITIONS)
        observer.start()
        truth = self.out / "truth.jsonl"
        generator = LoadGenerator(
            bootstrap=self.settings.kafka_bootstrap_servers, topic=self.topics["in"],
            partitions=PARTITIONS, run=self.run, accounts=self.accounts, log_path=truth,
            seed=self.seed, late_after_seconds=30,
            lifecycle_share=self.lifecycle_share, lifecycle_span=2 * self.hold_expiry_seconds,
            orphan_purchase_reversals=self.orphan_purchase_reversals)
        self.expiry = ExpiryRuns(self.supervisor.env, self.out / "expiry", self.seed)
        # The load runs CHAOS_SECONDS, and on while a fault that ran late is still striking,
        # then LOAD_AFTER_FAULTS more: every fault strikes under load and is followed by
        # messages, or its gap could not be measured (a slow machine had struck the last
        # fault after the load had ended).
        stop_load = threading.Event()
        load_failure: list[str] = []

        def send_load() -> None:
            try:
                generator.run(seconds=math.inf, rate=self.rate, stop=stop_load)
            except Exception as exc:  # a broken generator ends the run, never silently
                load_failure.append(f"{type(exc).__name__}: {exc}")
                raise

        load = threading.Thread(target=send_load)
        lanes = [threading.Thread(target=self.lane,
                                  args=("workers", self.worker_faults(), 0.25)),
                 threading.Thread(target=self.lane,
                                  args=("services", self.infra_faults(), 0.75))]
        load.start()
        # The faults begin once the group has formed and committed on every partition: a
        # fault striking while the three workers still join would count the group's
        # forming in its own gap.
        if not observer.wait_all_committed(timeout=120):
            self.errors.append("the workers had not committed on every partition 120 s "
                               "after the load began")
        for lane in lanes:
            lane.start()
        self.expiry.start()
        planned_end = time.monotonic() + self.seconds
        while time.monotonic() < planned_end and load.is_alive():
            time.sleep(min(10.0, max(0.0, planned_end - time.monotonic())))
            log(f"progress: {sum(generator.sent.values())} messages sent")
        if not load.is_alive():
            self.errors.append(f"the load generator stopped: {load_failure}")
            self.stop_faults.set()
        # Let the fault lanes finish what they planned (bounded), then stop them.
        for lane in lanes:
            lane.join(timeout=self.seconds)
        self.stop_faults.set()
        for lane in lanes:
            lane.join()
        self.expiry.stop()
        time.sleep(LOAD_AFTER_FAULTS)
        stop_load.set()
        load.join()
        generator.close()
        log(f"load done: {sum(generator.sent.values())} messages sent"
            + (f", {generator.placed} acknowledged without an offset found in their "
               "partitions" if generator.placed else ""))
        self.heal()
        caught_up = self.wait_for_zero_lag(timeout=600)
        if self.expiry.drain() != 0:
            self.errors.append("the last holds expire run (publishing the outbox) failed")
        observer.stop()
        self.supervisor.stop()
        report = check(self.worker_settings, truth, redis_prefix=f"CH-{self.run}-",
                       hold_expiry_hours=self.hold_expiry_seconds / 3600,
                       purged=self.purges.snapshot,
                       card_changes=self.accounts.toggle.started
                       if self.accounts.toggle else None)
        shadow = shadow_replay(self.purges.env, self.out / "shadow.txt")
        log(f"shadow replay of the whole stream: exit {shadow}")
        if shadow != 0:
            self.errors.append(f"payauth replay --shadow --to-earliest exited {shadow}: "
                               "deciding the stream again would change something "
                               f"({self.out / 'shadow.txt'})")
        ok = caught_up and report.ok and not generator.failed and not self.errors
        writes = [(m["acked"], m["partition"], m["offset"]) for m in read_log(truth)]
        text = self.table(generator.sent, report, generator.failed,
                          gaps_by_kind(observer.samples, self.fault_starts, writes))
        print(text)
        (self.out / "report.txt").write_text(text + "\n")
        self.cleanup(keep=not ok)
        return 0 if ok else 1

    def heal(self) -> None:
        log("faults stopped; healing the services, three workers running")
        self.heal_services()
        for slot, worker in enumerate(self.supervisor.slots):
            if worker is not None:
                worker.signal(signal.SIGCONT)
            self.supervisor.release(slot)

    def heal_services(self) -> None:
        """Redis up, PostgreSQL reachable (the services' faults may have left them down)."""
        self.proxy.restore()
        if self.redis.proc is None or self.redis.proc.poll() is not None:
            self.redis.start()

    def wait_for_zero_lag(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                remaining = sum(group_lag(client_config(self.worker_settings), self.group,
                                          self.topics["in"]).values())
                if remaining == 0:
                    log("lag is zero")
                    return True
            except Exception as exc:
                remaining = -1
                log(f"lag unknown yet: {exc}")
            time.sleep(2)
        log(f"lag did not reach zero in {timeout:.0f} s ({remaining} left)")
        return False

    def table(self, sent: Counter[str], report: object, failed: list[str],
              gaps: dict[str, list[Gap]]) -> str:
        from service.devtools.chaos.checker import Report

        assert isinstance(report, Report)
        totals = self.supervisor.totals()
        lines = ["", "messages sent by kind", "-" * 44]
        lines += [f"  {k:<32}{v:>10}" for k, v in sorted(sent.items())]
        lines.append(f"  {'total':<32}{sum(sent.values()):>10}")
        lines += ["", "faults injected by kind", "-" * 44]
        lines += [f"  {k:<32}{v:>10}" for k, v in sorted(self.faults.items())]
        lines.append(f"  {'total':<32}{sum(self.faults.values()):>10}")
        lines += ["", "outcomes (from the database and the topics)", "-" * 44]
        lines += [f"  {k:<32}{v:>10}" for k, v in sorted(report.accounted.items())]
        lines.append(f"  {'accounted for':<32}{sum(report.accounted.values()):>10}")
        lines += ["", "lifecycles (the log, and the holds' ends in the database)", "-" * 44]
        lines.append(f"  {'lifecycle messages sent (lc_*)':<32}"
                     f"{sum(v for k, v in sent.items() if k.startswith('lc_')):>10}")
        lines += [f"  {k:<32}{v:>10}" for k, v in report.lifecycle.items()]
        if self.expiry is not None:
            lines += [f"  {'holds expire runs, ' + k:<32}{v:>10}"
                      for k, v in sorted(self.expiry.outcomes.items())]
            lines += [f"  {'holds expire, two at once':<32}{self.expiry.concurrent:>10}",
                      f"  {'holds ended by runs exiting 0':<32}{self.expiry.ended:>10}"]
        lines.append(f"  {'dedup records purged':<32}{self.purges.deleted:>10}")
        lines += ["", "duplicates caught per layer (as scraped before each exit)", "-" * 44]
        for layer in ("redis", "postgres"):
            key = 'payauth_duplicates_total{layer="' + layer + '"}'
            lines.append(f"  {layer:<32}{totals[key]:>10}")
        lines += ["", "batch retries by cause (as scraped before each exit)", "-" * 44]
        retries = {k.split('"')[1]: v for k, v in totals.items()
                   if k.startswith("payauth_retries_total{")}
        lines += [f"  {cause:<32}{count:>10}" for cause, count in sorted(retries.items())]
        lines += ["", "gap after each fault: until a message sent after it is decided and",
                  "committed on some partition / on every partition (see chaos/gaps.py)",
                  "-" * 72]
        lines += render_gaps(gaps)
        decided = report.accounted.get("approved", 0) + report.accounted.get("declined", 0)
        violations = sum(len(f.violations) for f in report.findings)
        lines += ["", f"  {'messages decided during the run':<32}{decided:>10}",
                  f"  {'violations (must be 0)':<32}{violations:>10}"]
        lines += ["", "invariants", "-" * 44, report.render()]
        if failed or self.errors:
            lines += ["", "run problems:"] + [f"  {e}" for e in failed + self.errors]
        return "\n".join(lines)

    def close_services(self) -> None:
        """What the run started for its faults (a private Redis, the proxy)."""
        self.redis.stop()
        self.proxy.close()

    def cleanup(self, *, keep: bool) -> None:
        self.close_services()
        if keep:
            log(f"kept database {self.database} and topics chaos.{self.run}.* for inspection")
            return
        scratch.delete_topics(self.settings.kafka_bootstrap_servers, list(self.topics.values()))
        asyncio.run(scratch.drop_database(self.dsn, self.database))


def _stack(command: str) -> None:
    subprocess.run(["bash", str(STACK), command], check=True, stdout=subprocess.DEVNULL)


def _pg_is_ours() -> bool:
    data = "/var/lib/postgresql/payauth-stack" if os.geteuid() == 0 else str(
        ROOT / ".stack/postgres")
    return Path(os.environ.get("PG_DATA", data), "postmaster.pid").exists()


def main() -> int:
    seconds = float(os.environ.get("CHAOS_SECONDS", "240"))
    seed = int(os.environ.get("CHAOS_SEED", "1"))
    rate = float(os.environ.get("CHAOS_RATE", "100"))
    per_kind = int(os.environ.get("CHAOS_FAULTS_PER_KIND", str(max(5, int(seconds // 60)))))
    out = Path(os.environ.get("CHAOS_OUT", str(ROOT / ".chaos" / time.strftime("%Y%m%d-%H%M%S"))))
    if shutil.which("redis-server") is None:
        print("chaos: redis-server is needed (make stack-up installs it)")
        return 2
    return Chaos(load_settings(), seconds, seed, rate, per_kind, out).execute()


if __name__ == "__main__":
    raise SystemExit(main())
