"""The local replicated stack (``make ha-up``, deploy/local/ha.sh) seen from the HA chaos
run: which node leads, how to kill or pause one the way a crash or a frozen host would, and
how to bring it back. Starting a node is ha.sh's job (one place for its command line); this
module finds processes, signals them and waits for the engines to agree again.
Over 400 lines: the three engines' probes, kills and restarts, and the nodes' addresses,
side by side as ha.sh keeps them (one module the chaos run and the HA smoke import as ha).

The ports are ha.sh's (a deploy test holds the two to the same values); each node keeps
its own port, so a port names a node. Where a node is reached (its address; as root, in a
network namespace of its own) is what ha.sh wrote to .stack/ha/nodes when it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path

import asyncpg
import redis
from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at run time
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from service.devtools.chaos import netsplit
from service.devtools.processes import ROOT, port_open

HA_SH = ROOT / "deploy/local/ha.sh"
HA_DIR = ROOT / ".stack/ha"
KAFKA_PORTS = (19092, 19093, 19094)
KAFKA_PROXIED_PORTS = (19292, 19293, 19294)  # the PROXIED listener, behind the proxies
KAFKA_PROXY_PORTS = (19392, 19393, 19394)  # what that listener advertises (bridge_address)
PG_MONITOR_PORT = 15432
PG_NODE_PORTS = (15433, 15434, 15435)
REDIS_PORTS = (16379, 16380)
SENTINEL_PORTS = (26379, 26380, 26381)
SENTINEL_MASTER = "payauth"
KAFKA_CONTROLLER_PORTS = (19192, 19193, 19194)

# The node (ha_net.sh's name) that listens on each port.
NODE_OF_PORT: dict[int, str] = {
    PG_MONITOR_PORT: "pgm",
    **{port: f"pg{i}" for i, port in enumerate(PG_NODE_PORTS, 1)},
    **{port: f"k{i}" for ports in (KAFKA_PORTS, KAFKA_CONTROLLER_PORTS, KAFKA_PROXIED_PORTS)
       for i, port in enumerate(ports, 1)},
    **{port: f"r{i}" for i, port in enumerate(REDIS_PORTS, 1)},
    **{port: f"s{i}" for i, port in enumerate(SENTINEL_PORTS, 1)},
}


# Where the HA chaos run starts its three workers, a namespace each (ha_net.sh).
WORKER_NODES = ("w1", "w2", "w3")


@cache
def nodes() -> dict[str, tuple[str, str | None]]:
    """Each node's address and network namespace (None: on the loopback), as ha.sh wrote
    them when the stack started (``bridge``: the host's side, where the proxies listen);
    all on the loopback when it wrote none."""
    path = HA_DIR / "nodes"
    if not path.exists():
        return {node: ("127.0.0.1", None)
                for node in {*NODE_OF_PORT.values(), *WORKER_NODES, "bridge"}}
    found = {}
    for line in path.read_text().splitlines():
        name, address, namespace = line.split()
        found[name] = (address, None if namespace == "-" else namespace)
    return found


def host(port: int) -> str:
    """The address of the node that listens on ``port``."""
    return nodes()[NODE_OF_PORT[port]][0]


def split(node: str, peers: list[str], direction: netsplit.Direction = "both",
          loss_percent: int = 100) -> netsplit.Split:
    """``node`` (ha_net.sh's name: pg1, k2, r1, ...) cut from ``peers`` (names too); see
    netsplit.py. Only in the namespaces ha.sh made: on the loopback, no partition exists."""
    namespace = nodes()[node][1]
    if namespace is None:
        raise RuntimeError("the replicated stack runs on the loopback: a partition needs "
                           "each node in a namespace of its own (make ha-up as root)")
    return netsplit.Split(namespace, tuple(nodes()[peer][0] for peer in peers), direction,
                          loss_percent)


def namespaced() -> bool:
    """Whether the nodes run in namespaces of their own (partitions can be made)."""
    return all(nodes()[node][1] is not None
               for node in {*NODE_OF_PORT.values(), *WORKER_NODES})


def bridge_address() -> str:
    """The host's side of the stack's network: where the broker proxies listen."""
    return nodes()["bridge"][0]


def pg_ha_dir() -> Path:
    default = "/var/lib/postgresql/payauth-ha" if os.geteuid() == 0 else str(HA_DIR / "postgres")
    return Path(os.environ.get("PG_HA_DIR", default))


def _wait(what: str, condition: Callable[[], bool], timeout: float,
          interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:  # a node being killed or promoted answers oddly for a while
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _ha_sh(*args: str) -> None:
    subprocess.run(["bash", str(HA_SH), *args], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHON": os.environ.get("PYTHON", "python3")})


def _kill_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads or belongs to: ha.sh starts each node in a
    session of its own, so this is the whole node (keeper and server), as a crash is."""
    os.killpg(os.getpgid(pid), sig)


def _pidfile(path: Path) -> int:
    return int(path.read_text().split()[0])


# ------------------------------------------------------------------ PostgreSQL
def pg_query(port: int, sql: str, database: str = "postgres") -> object:
    """One value from the server on ``port`` (2 s to connect, 2 s to answer)."""
    async def run() -> object:
        conn = await asyncpg.connect(host=host(port), port=port, user="postgres",
                                     database=database, timeout=2)
        try:
            return await conn.fetchval(sql, timeout=2)
        finally:
            await conn.close()
    return asyncio.run(run())


def pg_number_sync_standbys() -> int:
    """The formation's number_sync_standbys, as the monitor holds it."""
    return int(str(pg_query(PG_MONITOR_PORT, "SELECT number_sync_standbys FROM "
                            "pgautofailover.formation WHERE formationid = 'default'",
                            database="pg_auto_failover")))


def pg_primary() -> int:
    """The node (1-3) that takes writes now."""
    for node, port in enumerate(PG_NODE_PORTS, 1):
        try:
            if pg_query(port, "SELECT NOT pg_is_in_recovery()"):
                return node
        except (OSError, asyncpg.PostgresError, TimeoutError):
            continue
    raise RuntimeError("no PostgreSQL node takes writes")


def pg_healthy() -> bool:
    """A primary with synchronous replication on, both secondaries streaming to it and in
    its quorum."""
    primary = PG_NODE_PORTS[pg_primary() - 1]
    names = pg_query(primary, "SELECT current_setting('synchronous_standby_names')")
    streaming = pg_query(primary, "SELECT count(*) FROM pg_stat_replication "
                                  "WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')")
    return bool(names) and streaming == len(PG_NODE_PORTS) - 1


def pg_kill(node: int) -> None:
    """kill -9 of the node, as a crash of its host: its pg_autoctl keeper, its postmaster
    and every PostgreSQL process. Each server process is in a session of its own (the
    postmaster's children call setsid), so they are found by parent, and killed first: a
    backend left behind keeps the shared memory and the node would not start again."""
    postmaster = _pidfile(pg_ha_dir() / f"node{node}" / "postmaster.pid")
    keeper = _keeper_pid(node)
    os.kill(postmaster, signal.SIGSTOP)  # no new child between the listing and the kill
    for child in _children(postmaster):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    _kill_group(postmaster, signal.SIGKILL)
    # Until the keeper is reaped: a keeper started while its predecessor's pid still exists
    # refuses to run ("an instance of pg_autoctl is already running"), and a restart right
    # after the kill (a second fault at once) met that.
    if keeper is not None:
        with contextlib.suppress(TimeoutError):
            _wait(f"node {node}'s keeper gone", lambda: not Path(f"/proc/{keeper}").exists(), 30)


def _keeper_pid(node: int) -> int | None:
    """The pid in the node's pg_autoctl pid file (kept under /tmp/pg_autoctl, by PGDATA)."""
    path = Path(f"/tmp/pg_autoctl{pg_ha_dir()}/node{node}/pg_autoctl.pid")
    try:
        return _pidfile(path)
    except (OSError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def pg_wait_failover(dead: int, timeout: float = 120) -> None:
    _wait("PostgreSQL failover", lambda: pg_primary() != dead, timeout)


def pg_wait_promoted_alone(dead: int, timeout: float = 120) -> int:
    """The node promoted in ``dead``'s place, as soon as it takes writes with synchronous
    replication off (pg_auto_failover's wait_primary), asked every 50 ms: that second is
    what a fault aims at."""
    def alone() -> bool:
        primary = pg_primary()
        return primary != dead and not pg_query(
            PG_NODE_PORTS[primary - 1], "SELECT current_setting('synchronous_standby_names')")
    _wait("a promoted primary without a synchronous standby", alone, timeout, interval=0.05)
    return pg_primary()


def pg_restart(node: int) -> None:
    """The node back (pg_rewind or a new base backup: pg_auto_failover decides), then until
    replication is synchronous again."""
    _ha_sh("pg-node-up", str(node))
    pg_wait_healthy()


def pg_start_together(numbers: list[int]) -> None:
    """Several nodes back at once (a formation with two nodes down may wait for both
    before either settles), then until replication is synchronous again."""
    threads = [threading.Thread(target=_ha_sh, args=("pg-node-up", str(node)))
               for node in numbers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pg_wait_healthy()


def pg_wait_healthy(timeout: float = 180) -> None:
    _wait("PostgreSQL synchronous replication", pg_healthy, timeout)


def pg_switchover() -> None:
    """A planned switchover, as an operator would ask it of the monitor."""
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    bindir = _pg_bindir()
    subprocess.run([*as_postgres, "env", f"PATH={bindir}:{os.environ['PATH']}",
                    "pg_autoctl", "perform", "switchover", "--pgdata",
                    str(pg_ha_dir() / "monitor"), "--wait", "120"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait("PostgreSQL synchronous replication", pg_healthy, 180)


def _pg_bindir() -> str:
    """The PostgreSQL server's programs (pg_autoctl runs pg_ctl from its PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no PostgreSQL server installed (make ha-up installs it)")
    return str(found[-1].parent)


def walsender_pids(node: int) -> list[int]:
    """The processes streaming WAL from ``node`` (the primary) to its standbys. Stopping
    them keeps new WAL on the primary alone; stopping the standbys' receivers would not
    (what was sent waits in the socket's buffers and is read on resumption, even after the
    primary died)."""
    pids = pg_query(PG_NODE_PORTS[node - 1],
                    "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_replication")
    if not isinstance(pids, list) or len(pids) != len(PG_NODE_PORTS) - 1:
        raise RuntimeError(f"node {node} does not stream to every standby (is it the primary?)")
    return [int(pid) for pid in pids]


# ----------------------------------------------------------------------- Kafka
def _admin() -> AdminClient:
    return AdminClient({"bootstrap.servers": ",".join(f"{host(p)}:{p}" for p in KAFKA_PORTS),
                        "log_level": 0})


def kafka_leaders(topics: list[str]) -> Counter[int]:
    """How many of ``topics``' partitions each node (1-3) leads."""
    meta = _admin().list_topics(timeout=10)
    counts: Counter[int] = Counter({1: 0, 2: 0, 3: 0})
    for name in topics:
        for part in meta.topics[name].partitions.values():
            if part.leader > 0:
                counts[part.leader] += 1
    return counts


def kafka_leader_map(topics: list[str], admin: AdminClient) -> tuple[int, ...]:
    """The leader of each partition of ``topics``, in a fixed order (-1: none)."""
    meta = admin.list_topics(timeout=5)
    return tuple(meta.topics[name].partitions[p].leader
                 for name in topics for p in sorted(meta.topics[name].partitions))


class KafkaLeaderProbe:
    """``kafka_leader_map`` for a caller that keeps asking (the failover watcher), through
    one admin client that is replaced after a failed ask. A client keeps sending its
    metadata requests to a broker it is connected to, a paused one too, until its socket
    times out (a minute by default): a watcher that kept one client was blind for a whole
    pause and missed the leaderships the pause moved. A new client connects only to the
    brokers that answer."""

    def __init__(self, topics: list[str], make_admin: Callable[[], AdminClient] = _admin) -> None:
        self._topics = topics
        self._make_admin = make_admin
        self._admin = make_admin()
        # kept, not dropped: destroying a client may wait on the quiet broker, and the
        # watcher must not (a handful per run)
        self._stuck: list[AdminClient] = []

    @property
    def clients_replaced(self) -> int:
        return len(self._stuck)

    def __call__(self) -> tuple[int, ...]:
        try:
            return kafka_leader_map(self._topics, self._admin)
        except KafkaException:
            self._stuck.append(self._admin)
            self._admin = self._make_admin()
            raise


def kafka_controller() -> int:
    """The active KRaft controller, as the quorum itself last recorded it: the highest
    epoch's leader in the nodes' quorum-state files. (Through a broker the client API does
    not tell: a KRaft broker names a random live broker as "the controller".)"""
    best = (-1, -1)
    for node in (1, 2, 3):
        path = HA_DIR / f"kafka-{node}" / "data" / "__cluster_metadata-0" / "quorum-state"
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(path.read_text())
            best = max(best, (int(state["leaderEpoch"]), int(state["leaderId"])))
    if best[1] < 0:
        raise RuntimeError("no Kafka node has elected a controller")
    return best[1]


def kafka_balanced(topics: list[str]) -> bool:
    """Every partition of ``topics`` led by its preferred replica (the first assigned)."""
    meta = _admin().list_topics(timeout=10)
    return all(p.leader == p.replicas[0]
               for name in topics for p in meta.topics[name].partitions.values())


def kafka_balance(topics: list[str], timeout: float = 60) -> None:
    """Leadership back on each partition's preferred replica, as Kafka's own imbalance check
    would do within leader.imbalance.check.interval.seconds: a fault that follows then finds
    each node leading its third, whatever the faults before it moved."""
    admin = _admin()  # held until the answer: a client collected before it cancels the call
    meta = admin.list_topics(timeout=10)
    partitions = [TopicPartition(name, p) for name in topics for p in meta.topics[name].partitions]

    def elected() -> bool:
        if kafka_balanced(topics):
            return True
        # ELECTION_NOT_NEEDED for a partition already led by its preferred replica: fine
        # (no request_timeout: confluent-kafka 2.16.1's elect_leaders raises SystemError
        # on any keyword argument)
        with contextlib.suppress(KafkaException):
            admin.elect_leaders(ElectionType.PREFERRED, partitions).result(timeout=15)
        return kafka_balanced(topics)
    _wait("Kafka preferred leaders", elected, timeout)


def kafka_in_sync(topics: list[str]) -> bool:
    """Every partition of ``topics`` led, with all three replicas in sync."""
    meta = _admin().list_topics(timeout=10)
    return all(p.leader > 0 and len(p.isrs) == 3
               for name in topics for p in meta.topics[name].partitions.values())


def _kafka_pid(node: int) -> int:
    return _pidfile(HA_DIR / f"kafka-{node}" / "kafka.pid")


def kafka_kill(node: int) -> None:
    _kill_group(_kafka_pid(node), signal.SIGKILL)


def kafka_pause(node: int) -> None:
    os.kill(_kafka_pid(node), signal.SIGSTOP)


def kafka_resume(node: int) -> None:
    os.kill(_kafka_pid(node), signal.SIGCONT)


def kafka_restart(node: int, topics: list[str]) -> None:
    """The node back, in sync, and leading its preferred partitions again. Once the killed
    node's port is closed: ha.sh starts a node only if nothing listens on its port, and a
    dying JVM can still hold it for a moment after the kill."""
    port, deadline = KAFKA_PORTS[node - 1], time.monotonic() + 10
    # still open after 10 s: a node that was never killed, which ha.sh leaves running
    while port_open(host(port), port) and time.monotonic() < deadline:
        time.sleep(0.1)
    _ha_sh("kafka-node-up", str(node))
    kafka_wait_in_sync(topics)
    kafka_balance(topics)


def kafka_wait_in_sync(topics: list[str], timeout: float = 180) -> None:
    _wait("Kafka replicas back in sync", lambda: kafka_in_sync(topics), timeout)


def kafka_wait_fenced(node: int, topics: list[str], timeout: float = 60) -> None:
    """Until the controller has taken ``node`` out of every partition's in-sync replicas
    (it fences a node that stopped heartbeating after broker.session.timeout.ms)."""
    def fenced() -> bool:
        meta = _admin().list_topics(timeout=10)
        return all(p.leader not in (-1, node) and node not in p.isrs
                   for name in topics for p in meta.topics[name].partitions.values())
    _wait(f"Kafka node {node} fenced", fenced, timeout)


def set_min_insync_replicas(topic: str, count: int) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.insync.replicas", str(count),
                    incremental_operation=AlterConfigOpType.SET)])
    admin = _admin()  # held until the answer: a client collected before it cancels the call
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


# ----------------------------------------------------------------------- Redis
def _sentinel(port: int) -> redis.Redis:
    return redis.Redis(host=host(port), port=port, socket_timeout=2, decode_responses=True)


def redis_master() -> int:
    """The master's port, as the Sentinels name it."""
    for port in SENTINEL_PORTS:
        try:
            _, master_port = _sentinel(port).sentinel_get_master_addr_by_name(  # type: ignore[no-untyped-call]
                SENTINEL_MASTER)
            return int(master_port)
        except (redis.RedisError, TypeError):
            continue
    raise RuntimeError("no Sentinel answers")


def redis_kill(port: int) -> None:
    os.kill(_pidfile(HA_DIR / "redis" / f"redis-{port}.pid"), signal.SIGKILL)


def redis_wait_failover(dead: int, timeout: float = 60) -> None:
    _wait("Sentinel failover", lambda: redis_master() != dead, timeout)


def redis_restart(port: int) -> None:
    """Back as the replica of the master the Sentinels promoted."""
    _ha_sh("redis-node-up", str(port))
    redis_wait_replica(port)


def redis_wait_replica(port: int) -> None:
    """Until the node on ``port`` replicates the master (the Sentinels reconfigure a master
    they failed over from once they reach it again)."""
    def replicating() -> bool:
        client = redis.Redis(host=host(port), port=port, socket_timeout=2)
        info: dict[str, object] = client.info("replication")  # type: ignore[assignment]
        return info.get("role") == "slave" and info.get("master_link_status") == "up"
    _wait("Redis replica linked", replicating, 60)
