"""``make ha-chaos``: the chaos run on the replicated stack (``make ha-up``), with the
failures a bank's payments run on these engines meets, and the same checker and table.

Three workers in one group reach the brokers through a TCP proxy each (the brokers'
PROXIED listener), PostgreSQL through the multi-host URL (``target_session_attrs``), Redis
through the Sentinels. The load is ``make chaos``'s, lifecycles included, and ``payauth
holds expire`` runs among the faults with the workers' settings (the multi-host URL, the
proxied brokers). Two lanes of seeded faults: the worker faults of ``make chaos``, and:

- ``postgres_primary_killed``: kill -9 of the primary node (keeper and server); the monitor
  promotes the most advanced of the two secondaries; the old primary rejoins as a
  secondary;
- ``postgres_switchover``: ``pg_autoctl perform switchover``;
- ``kafka_leader_killed``: leadership balanced first (each partition on its preferred
  replica), then kill -9 of a node (each in turn), which takes away the leadership of the
  input/output partitions it led (the table lists how many, per kill), restarted 5-15 s
  later;
- ``kafka_broker_paused``: SIGSTOP of a node for 12 s (past the 4 s broker session
  timeout: the controller fences it and moves its leaders), then SIGCONT;
- ``kafka_not_enough_replicas``: a node killed, and once it is fenced the output topic's
  ``min.insync.replicas`` raised to 3 for 8-15 s: every result write is refused, past the
  workers' delivery timeout (5 s here); then 2 again and the node back;
- ``redis_master_killed``: kill -9 of the Redis master; the Sentinels promote the replica;
  the old master rejoins as a replica;
- ``kafka_broker_cut``: the workers' proxy to one broker resets every connection and
  refuses new ones for 3-10 s (replication between brokers carries on).
- ``postgres_promoted_primary_killed`` (by name only, in ``HA_CHAOS_KINDS``): a second
  fault inside the second after a promotion: the primary killed, then the node promoted in
  its place as soon as it takes writes without a synchronous standby (pg_auto_failover's
  ``wait_primary``); both come back;
- the partitions (as root, each node in a namespace of its own: ha_partitions.py): the
  PostgreSQL primary cut from its monitor and standbys (both ways, one way), a Kafka node
  from the two others (fully, lossy), the Redis master from the Sentinels, a worker from
  Kafka (docs/high-availability.md, "Partitions").

Each fault ends with the engine whole again (replicas in sync, Kafka's leadership on the
preferred replicas), so the next finds a healthy cluster. The workers' delivery timeout is
5 s, so that refused writes outlast it. The table adds each fault kind's gap (see gaps.py),
the workers' batch retries by cause, and the failovers a watcher saw, with those no fault
explains (see failovers.py). Then, as in ``make chaos``, ``payauth replay --shadow
--to-earliest`` must change nothing; ``payauth purge`` is not among these faults.

``HA_CHAOS_CONTROL=async`` is the negative control: the workers commit with
``synchronous_commit=local``, the primary's WAL senders are stopped during a burst, and the
primary is killed right after it. The checker must then FAIL (decisions published and
offsets committed that the new primary does not have); if it passes, it cannot see the
failure synchronous replication is there to prevent. ``HA_CHAOS_CONTROL=partition`` is the
same control made by a partition (the nodes in namespaces): with the same commits, the
primary cut from its monitor and standbys while the workers reach it; what it acknowledged
before its keeper stopped it, the promoted standby lacks.

    CHAOS_SECONDS (600)  CHAOS_SEED (1)  CHAOS_RATE (100)  CHAOS_FAULTS_PER_KIND (3)
    HA_CHAOS_KINDS: comma-separated fault kinds to run (default: all of both lanes)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from service.config import Settings, load_settings
from service.devtools import scratch
from service.devtools.chaos import failovers, netsplit
from service.devtools.chaos import ha_stack as ha
from service.devtools.chaos.gaps import Gap, each_gap
from service.devtools.chaos.generator import seed_accounts
from service.devtools.chaos.ha_partitions import Partitions
from service.devtools.chaos.proxy import TcpProxy
from service.devtools.chaos.purges import dedup_period_seconds
from service.devtools.chaos.run import PARTITIONS, Chaos, Supervisor, log
from service.devtools.processes import ROOT

HA_ENV = ROOT / ".stack/ha.env"
BROKER_CUT_LONGEST_S = 10  # kafka_broker_cut: the longest the workers lose one broker
# The workers' group session in this run (see setup()): it rides out the longest cut, even
# of the group's coordinator, and a heartbeat more.
GROUP_SESSION_MS = (BROKER_CUT_LONGEST_S + 2) * 1000


class HaChaos(Chaos):
    def __init__(self, settings: Settings, seconds: float, seed: int, rate: float,
                 per_kind: int, out_dir: Path, *, kinds: set[str] | None,
                 control: str = "") -> None:
        super().__init__(settings, seconds, seed, rate, per_kind, out_dir)
        self.kinds = kinds
        self.control = control  # "" (none), "async" or "partition": see the module's doc
        self.splits = Partitions(self.rng, self.landed, self.replicated_topics,
                                 session_seconds=GROUP_SESSION_MS / 1000)
        self.killed_brokers: set[int] = set()
        self.leader_kills: list[tuple[int, int]] = []  # (node, partitions it led)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        asyncio.run(scratch.create_database(
            self.dsn, self.database,
            dedup_period_seconds=dedup_period_seconds(self.retention_seconds)))
        bootstrap = self.settings.kafka_bootstrap_servers
        scratch.create_topics(bootstrap, {self.topics["in"]: PARTITIONS,
                                          self.topics["out"]: PARTITIONS,
                                          self.topics["dlq"]: 3}, replication_factor=3)
        ha.kafka_wait_in_sync(self.replicated_topics())
        # On the host's side of the stack's bridge: the workers' namespaces reach it there.
        self.broker_proxies = [TcpProxy(inner, ha.host(inner), listen_port=outer,
                                        listen_host=ha.bridge_address())
                               for inner, outer
                               in zip(ha.KAFKA_PROXIED_PORTS, ha.KAFKA_PROXY_PORTS,
                                      strict=True)]
        self.accounts = asyncio.run(seed_accounts(self.dsn, self.run))
        self.worker_settings = Settings(
            kafka_bootstrap_servers=bootstrap, group_id=self.group,
            input_topic=self.topics["in"], output_topic=self.topics["out"],
            dlq_topic=self.topics["dlq"], database_url=SecretStr(self.dsn),
            redis_sentinels=self.settings.redis_sentinels,
            redis_sentinel_master=self.settings.redis_sentinel_master)
        dsn = self.dsn + ("&synchronous_commit=local" if self.control else "")
        env = self.worker_env({
            "PAYAUTH_KAFKA_BOOTSTRAP_SERVERS": ",".join(
                f"{ha.bridge_address()}:{port}" for port in ha.KAFKA_PROXY_PORTS),
            "PAYAUTH_DATABASE_URL": dsn,
            "PAYAUTH_REDIS_SENTINELS": self.settings.redis_sentinels,
            "PAYAUTH_REDIS_SENTINEL_MASTER": self.settings.redis_sentinel_master,
            # shorter than the refused writes of kafka_not_enough_replicas: deliveries time out
            "PAYAUTH_DELIVERY_TIMEOUT_MS": "5000",
            # The group's session is what a stopped or cut worker holds its partitions for
            # (GROUP_SESSION_MS). A coordinator's failover does not count against it: the new
            # coordinator gives every member it loads a whole session from the load
            # (docs/failover.md). The poll interval may not be shorter than the session
            # (librdkafka refuses it).
            "PAYAUTH_SESSION_TIMEOUT_MS": str(GROUP_SESSION_MS),
            "PAYAUTH_MAX_POLL_INTERVAL_MS": str(GROUP_SESSION_MS),
        })
        # Each worker slot in a namespace of its own where the nodes have theirs (a worker can
        # then be cut from Kafka alone); its metrics are read at its address.
        placements: list[tuple[tuple[str, ...], str]] | None = None
        if ha.namespaced():
            placements = [(("ip", "netns", "exec", str(ha.nodes()[node][1])), ha.nodes()[node][0])
                          for node in ha.WORKER_NODES]
        self.supervisor = Supervisor(env, self.out / "workers", placements=placements)
        # No purge among this run's faults (the failovers are its subject): the purges'
        # snapshot stays empty, and the shadow replay at the end reads the database directly.
        self.purges = self.purges_with(env)
        self.started = time.time()
        self.watcher = self.leader_watcher()
        self.watcher.start()

    def leader_watcher(self) -> failovers.LeaderWatcher:
        """Who leads each engine, sampled each second (see failovers.py)."""
        return failovers.LeaderWatcher({
            "postgres primary": ha.pg_primary,
            "redis master": ha.redis_master,
            "kafka controller": ha.kafka_controller,
            "kafka leaders": ha.KafkaLeaderProbe(self.replicated_topics()),
        }, interval=1.0)

    def replicated_topics(self) -> list[str]:
        return [self.topics["in"], self.topics["out"]]

    # ----------------------------------------------------------------- faults
    def _only(self, faults: dict[str, Callable[[], None]]) -> dict[str, Callable[[], None]]:
        return {k: f for k, f in faults.items() if self.kinds is None or k in self.kinds}

    def worker_faults(self) -> dict[str, Callable[[], None]]:
        return {} if self.control else self._only(super().worker_faults())

    def infra_faults(self) -> dict[str, Callable[[], None]]:
        if self.control == "async":
            return {"postgres_primary_killed_async": self.postgres_primary_killed_async}
        if self.control == "partition":
            return {"postgres_primary_partitioned_async":
                    lambda: self.splits.postgres_primary(
                        "both", kind="postgres_primary_partitioned_async")}
        return self._only({
            "postgres_primary_killed": self.postgres_primary_killed,
            "postgres_switchover": ha.pg_switchover,
            "kafka_leader_killed": self.kafka_leader_killed,
            "kafka_broker_paused": self.kafka_broker_paused,
            "kafka_not_enough_replicas": self.kafka_not_enough_replicas,
            "redis_master_killed": self.redis_master_killed,
            "kafka_broker_cut": self.kafka_broker_cut,
            **(self.splits.faults() if ha.namespaced() else {}),
        }) | {  # asked for by name only (HA_CHAOS_KINDS): it can leave a node that cannot
            # rejoin (docs/failover.md, "The second after a promotion")
            kind: fault for kind, fault in {
                "postgres_promoted_primary_killed": self.postgres_promoted_primary_killed,
            }.items() if self.kinds is not None and kind in self.kinds}

    def postgres_primary_killed(self) -> None:
        primary = ha.pg_primary()
        try:
            ha.pg_kill(primary)
            self.landed("postgres_primary_killed")
            ha.pg_wait_failover(primary)
            log(f"postgres: node {ha.pg_primary()} promoted; node {primary} rejoins")
        finally:
            ha.pg_restart(primary)

    def postgres_promoted_primary_killed(self) -> None:
        """A second fault inside the second after a promotion: the primary killed, then the
        standby promoted in its place killed as soon as it takes writes, while
        pg_auto_failover 2.0 runs it without synchronous replication (until a standby
        follows it: docs/failover.md, "The second after a promotion"). Both come back."""
        first = ha.pg_primary()
        second = None
        try:
            ha.pg_kill(first)
            self.landed("postgres_promoted_primary_killed")
            second = ha.pg_wait_promoted_alone(first)
            ha.pg_kill(second)
            log(f"postgres: node {first} killed, then node {second} as soon as it took writes "
                "without a synchronous standby")
        finally:
            ha.pg_start_together([first] if second is None else [first, second])

    def postgres_primary_killed_async(self) -> None:
        """The negative control's fault: commits that never leave the primary (its WAL
        senders stopped), then the primary's death."""
        primary = ha.pg_primary()
        senders = ha.walsender_pids(primary)
        for sender in senders:
            os.kill(sender, signal.SIGSTOP)
        try:
            self.landed("postgres_primary_killed_async")
            time.sleep(4)  # a burst decided, published and its offsets committed (500 ms)
            ha.pg_kill(primary)  # the stopped senders with it
            ha.pg_wait_failover(primary)
            log(f"postgres: node {ha.pg_primary()} promoted without the burst; "
                f"node {primary} rejoins")
        finally:
            for sender in senders:
                with contextlib.suppress(ProcessLookupError):  # killed with its primary, or not
                    os.kill(sender, signal.SIGCONT)
            ha.pg_restart(primary)

    def kafka_leader_killed(self) -> None:
        """Kill a node that leads partitions now. Leadership is balanced first: left alone it
        gathers on the nodes that stayed up (a node back leads nothing until Kafka's
        imbalance check), and a node leading nothing would make this fault a no-op."""
        topics = self.replicated_topics()
        ha.kafka_balance(topics)
        leaders = ha.kafka_leaders(topics)
        if len(self.killed_brokers) == len(leaders):
            self.killed_brokers.clear()  # each node in turn, then again
        node = max((n for n in leaders if n not in self.killed_brokers), key=leaders.__getitem__)
        if leaders[node] == 0:  # balancing failed: the busiest node instead
            node = max(leaders, key=leaders.__getitem__)
        self.killed_brokers.add(node)
        log(f"kafka: killing node {node}, leader of {leaders[node]} partitions")
        ha.kafka_kill(node)
        self.landed("kafka_leader_killed")
        self.leader_kills.append((node, leaders[node]))
        try:
            time.sleep(self.rng.uniform(5, 15))
        finally:
            ha.kafka_restart(node, topics)

    def kafka_not_enough_replicas(self) -> None:
        """A node down and the output topic asking for three in-sync replicas: every write
        of a result is refused (NOT_ENOUGH_REPLICAS) for 8-15 s, longer than the workers'
        delivery timeout. No offset may be committed for a message whose result was not
        written; the checker finds any (an event missing)."""
        topics = self.replicated_topics()
        node = self.rng.randint(1, 3)
        ha.kafka_kill(node)
        try:
            ha.kafka_wait_fenced(node, topics)
            try:
                ha.set_min_insync_replicas(self.topics["out"], 3)
                self.landed("kafka_not_enough_replicas")  # writes refused from here
                time.sleep(self.rng.uniform(8, 15))
            finally:
                ha.set_min_insync_replicas(self.topics["out"], 2)
        finally:  # whatever went wrong, the next fault finds three nodes
            ha.kafka_restart(node, topics)

    def kafka_broker_paused(self) -> None:
        node = self.rng.randint(1, 3)
        ha.kafka_pause(node)
        try:
            self.landed("kafka_broker_paused")
            time.sleep(12)
        finally:
            ha.kafka_resume(node)
        ha.kafka_wait_in_sync(self.replicated_topics())
        ha.kafka_balance(self.replicated_topics())

    def redis_master_killed(self) -> None:
        master = ha.redis_master()
        ha.redis_kill(master)
        try:
            self.landed("redis_master_killed")
            ha.redis_wait_failover(master)
        finally:
            ha.redis_restart(master)

    def kafka_broker_cut(self) -> None:
        proxy = self.broker_proxies[self.rng.randrange(len(self.broker_proxies))]
        proxy.cut()
        try:
            time.sleep(self.rng.uniform(3, BROKER_CUT_LONGEST_S))
        finally:
            proxy.restore()

    # ----------------------------------------------------------------- report
    def table(self, sent: Counter[str], report: object, failed: list[str],
              gaps: dict[str, list[Gap]]) -> str:
        """The common table, then the leader kills and the failovers seen."""
        self.watcher.stop()  # the run is over: nothing more to attribute
        seen = failovers.attribute(self.watcher.samples, self.fault_spans)
        lines = [super().table(sent, report, failed, gaps), "",
                 "kafka_leader_killed: input/output partitions each kill took away", "-" * 44]
        lines += [f"  node {node:<27}{count:>10}" for node, count in self.leader_kills]
        if not self.leader_kills:
            lines.append("  (no leader kill in this run)")
        lines += ["", "failovers seen (leader changes; a fault of the engine's kind striking",
                  "or settling explains one, see chaos/failovers.py)", "-" * 60]
        lines += failovers.render(seen, self.started, self.watcher.samples)
        lines += ["", "each fault's gap, and the next fault's strike (a gap longer than that",
                  "counts the next fault too)", "-" * 72]
        lines += each_gap(self.fault_starts, gaps, self.started)
        (self.out / "failovers.txt").write_text("".join(
            f"{f.at:.1f} {f.engine} {f.before} -> {f.after} cause={f.cause}\n" for f in seen))
        return "\n".join(lines)

    # ---------------------------------------------------------- heal, cleanup
    def heal_services(self) -> None:
        for proxy in self.broker_proxies:
            proxy.restore()
        for _, namespace in ha.nodes().values():
            if namespace is not None:  # (the host's side has none)
                netsplit.heal(namespace)

    def close_services(self) -> None:
        for proxy in self.broker_proxies:
            proxy.close()

    def cleanup(self, *, keep: bool) -> None:
        super().cleanup(keep=keep and not self.control)  # the control's failure is expected


def read_ha_env(path: Path = HA_ENV) -> dict[str, str]:
    """The ``PAYAUTH_*`` lines ``make ha-up`` wrote (a value quoted as a shell reads it)."""
    if not path.exists():
        raise SystemExit("ha-chaos: no .stack/ha.env: start the replicated stack with make ha-up")
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if "=" in line and not line.startswith("#"))
    return {key.strip(): "".join(shlex.split(value)) for key, value in pairs}


def main() -> int:
    os.environ.update(read_ha_env())
    control = os.environ.get("HA_CHAOS_CONTROL", "")
    if control not in ("", "async", "partition"):
        raise SystemExit(f"ha-chaos: HA_CHAOS_CONTROL={control!r}: async or partition")
    seconds = float(os.environ.get("CHAOS_SECONDS", "90" if control else "600"))
    kinds = {k.strip() for k in os.environ.get("HA_CHAOS_KINDS", "").split(",") if k.strip()}
    out = Path(os.environ.get("CHAOS_OUT", str(ROOT / ".chaos" / ("ha-" + time.strftime(
        "%Y%m%d-%H%M%S")))))
    run = HaChaos(load_settings(), seconds, int(os.environ.get("CHAOS_SEED", "1")),
                  float(os.environ.get("CHAOS_RATE", "100")),
                  int(os.environ.get("CHAOS_FAULTS_PER_KIND", "1" if control else "3")), out,
                  kinds=kinds or None, control=control)
    if control:
        log("negative control: asynchronous commits, the standby behind at the "
            f"{'kill' if control == 'async' else 'partition'}; the checker must report what "
            "was lost")
    return run.execute()


if __name__ == "__main__":
    raise SystemExit(main())
