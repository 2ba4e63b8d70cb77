"""The HA chaos run's partitions (ha.py): the faults that split a cluster, where each node
runs in a network namespace of its own (deploy/local/ha_net.sh; as root). Each cuts a node
from some of its peers with netsplit.py while the workers still reach it, strikes, waits,
heals, then waits for its engine to be whole again (docs/high-availability.md,
"Partitions", says what each does and what the stack answers).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from service.devtools.chaos import ha_stack as ha
from service.devtools.chaos import netsplit
from service.devtools.chaos.run import log

# The kinds, in the order the run's schedule lists them; and the share of packets the lossy
# link drops.
PARTITION_KINDS = ("postgres_primary_partitioned", "postgres_primary_one_way",
                   "kafka_broker_partitioned", "kafka_broker_lossy", "redis_master_partitioned",
                   "worker_cut_from_kafka")
LOSSY_PERCENT = 30


class Partitions:
    def __init__(self, rng: random.Random, landed: Callable[[str], None],
                 topics: Callable[[], list[str]], *, session_seconds: float) -> None:
        """``landed``: the run's mark of a fault's strike; ``topics``: the replicated topics
        whose leadership must be whole again; ``session_seconds``: the workers' group
        session, which a worker's cut outlasts."""
        self.rng = rng
        self.landed = landed
        self.topics = topics
        self.session_seconds = session_seconds

    def faults(self) -> dict[str, Callable[[], None]]:
        """Each kind, by its name in the run's table."""
        faults: dict[str, Callable[[], None]] = {
            "postgres_primary_partitioned": lambda: self.postgres_primary("both"),
            "postgres_primary_one_way": lambda: self.postgres_primary("out"),
            "kafka_broker_partitioned": lambda: self.kafka_broker(100),
            "kafka_broker_lossy": lambda: self.kafka_broker(LOSSY_PERCENT),
            "redis_master_partitioned": self.redis_master,
            "worker_cut_from_kafka": self.worker_from_kafka,
        }
        assert tuple(faults) == PARTITION_KINDS
        return faults

    def postgres_primary(self, direction: netsplit.Direction, kind: str = "") -> None:
        """The primary cut from the monitor and both standbys (``out``: only what it sends
        them is lost), while the workers still reach it: its commits cannot reach a
        standby, so none may be acknowledged; its keeper stops it once it has heard from
        neither the monitor nor a standby for network_partition_timeout, and the monitor
        promotes a standby. Healed once a standby took over and has taken writes a while;
        the old primary then rejoins as a secondary (pg_rewind)."""
        kind = kind or ("postgres_primary_partitioned" if direction == "both"
                        else "postgres_primary_one_way")
        primary = ha.pg_primary()
        split = ha.split(f"pg{primary}", ["pgm", *(f"pg{n}" for n in (1, 2, 3) if n != primary)],
                         direction)
        netsplit.cut(split)
        try:
            self.landed(kind)
            ha.pg_wait_failover(primary)
            log(f"postgres: node {primary} cut off ({direction}); node {ha.pg_primary()} "
                "promoted")
            time.sleep(self.rng.uniform(3, 8))
        finally:
            netsplit.heal(split.namespace)
        ha.pg_wait_healthy()

    def kafka_broker(self, loss_percent: int) -> None:
        """A node cut from the two others (the controller quorum and replication), not from
        the clients: the quorum fences it after the broker session and moves its
        leaderships; a producer with acks=all cannot have a write acknowledged by it alone
        (min.insync.replicas 2). ``loss_percent`` below 100: a lossy link instead, a share
        of those packets lost."""
        kind = "kafka_broker_partitioned" if loss_percent == 100 else "kafka_broker_lossy"
        topics = self.topics()
        ha.kafka_balance(topics)
        node = self.rng.randint(1, 3)
        split = ha.split(f"k{node}", [f"k{n}" for n in (1, 2, 3) if n != node],
                         loss_percent=loss_percent)
        netsplit.cut(split)
        try:
            self.landed(kind)
            time.sleep(self.rng.uniform(8, 15))
        finally:
            netsplit.heal(split.namespace)
        ha.kafka_wait_in_sync(topics)
        ha.kafka_balance(topics)

    def worker_from_kafka(self) -> None:
        """One worker cut from every broker (and the proxies before them) while it still
        reaches PostgreSQL and Redis, for longer than the group's session: the coordinator
        gives its partitions to the others, which decide them again from the committed
        offsets, while the cut worker may still be deciding what it had fetched. The claim
        (the unique transaction_id) lets one decision through; the cut worker can neither
        publish nor commit an offset. Healed, it rejoins the group."""
        slot = self.rng.randrange(len(ha.WORKER_NODES))
        split = ha.split(ha.WORKER_NODES[slot], ["bridge", "k1", "k2", "k3"])
        netsplit.cut(split)
        try:
            self.landed("worker_cut_from_kafka")
            log(f"workers: slot {slot} cut from Kafka")
            time.sleep(self.session_seconds + self.rng.uniform(5, 10))
        finally:
            netsplit.heal(split.namespace)

    def redis_master(self) -> None:
        """The Redis master cut from the three Sentinels, not from the workers or its
        replica: the Sentinels promote the replica, and for a while two masters take
        writes (Redis is the fast path only: a worker that reads a stale or missing
        entry there asks PostgreSQL). Healed, the old master is made a replica by the
        Sentinels."""
        master = ha.redis_master()
        node = ha.NODE_OF_PORT[master]
        split = ha.split(node, ["s1", "s2", "s3"])
        netsplit.cut(split)
        try:
            self.landed("redis_master_partitioned")
            ha.redis_wait_failover(master)
            time.sleep(self.rng.uniform(3, 8))
        finally:
            netsplit.heal(split.namespace)
        ha.redis_wait_replica(master)
