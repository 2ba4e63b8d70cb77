"""Failovers the HA chaos run saw, and whether a fault explains each.

A watcher samples, once a second from outside the workers, who leads each engine: the
PostgreSQL node that takes writes, the Redis master the Sentinels name, the Kafka active
controller and the leader of each input and output partition. Every change is a failover;
it is *injected* when a fault that can cause it (a kind of ``CAUSES`` for that engine) was
striking at that moment or had ended at most ``settle`` seconds before (the engine's own
recovery: a node back takes its preferred leaderships again within Kafka's 30 s imbalance
check, the old PostgreSQL primary rejoins). Any other change is one nobody injected: a
false failover (a live node judged dead because it was slow on these shared cores, say),
which the table reports as a finding, never as a pass.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# The fault kinds that may move each engine's leadership (ha.py's infra faults).
CAUSES: dict[str, frozenset[str]] = {
    "postgres primary": frozenset({"postgres_primary_killed", "postgres_switchover",
                                   "postgres_primary_killed_async",
                                   "postgres_primary_partitioned", "postgres_primary_one_way",
                                   "postgres_primary_partitioned_async",
                                   "postgres_promoted_primary_killed"}),
    "redis master": frozenset({"redis_master_killed", "redis_master_partitioned"}),
    "kafka controller": frozenset({"kafka_leader_killed", "kafka_broker_paused",
                                   "kafka_not_enough_replicas", "kafka_broker_partitioned",
                                   "kafka_broker_lossy"}),
    "kafka leaders": frozenset({"kafka_leader_killed", "kafka_broker_paused",
                                "kafka_not_enough_replicas", "kafka_broker_partitioned",
                                "kafka_broker_lossy"}),
}
# How long after a fault of its kind a change is still that fault's recovery, per engine:
# Kafka's preferred-leader check runs every 30 s (ha-server.properties) after a node's return.
SETTLE_SECONDS: dict[str, float] = {"postgres primary": 20.0, "redis master": 20.0,
                                    "kafka controller": 20.0, "kafka leaders": 45.0}

Span = tuple[str, float, float]  # (fault kind, start, end) in wall time
Leaders = dict[str, object]  # engine -> who leads it (None: nobody answered)


@dataclass(frozen=True)
class Failover:
    at: float
    engine: str
    before: object
    after: object
    cause: str | None  # the fault kind that explains it, or None: nobody injected it


def changes(samples: list[tuple[float, Leaders]]) -> list[tuple[float, str, object, object]]:
    """(time, engine, before, after) for each change of a known leader to another known
    one. A sample where an engine did not answer (None) is skipped: a node being killed
    answers nothing for a while, and "nobody" is not a leader."""
    last: dict[str, object] = {}
    out = []
    for t, leaders in samples:
        for engine, who in leaders.items():
            if who is None:
                continue
            if engine in last and last[engine] != who:
                out.append((t, engine, last[engine], who))
            last[engine] = who
    return out


def attribute(samples: list[tuple[float, Leaders]], spans: list[Span],
              settle: dict[str, float] | None = None) -> list[Failover]:
    """Each change with the fault that explains it (see the module's docstring)."""
    settle = SETTLE_SECONDS if settle is None else settle
    out = []
    for t, engine, before, after in changes(samples):
        cause = next((kind for kind, start, end in spans
                      if kind in CAUSES.get(engine, frozenset())
                      and start <= t <= end + settle.get(engine, 0.0)), None)
        out.append(Failover(t, engine, before, after, cause))
    return out


def render(failovers: list[Failover], started: float,
           samples: list[tuple[float, Leaders]] | None = None) -> list[str]:
    """Per engine: the failovers a fault explains and those nobody injected (with when);
    with ``samples`` (the watcher's), how often it looked and its longest blind spell: the
    longest time an engine went without an answer (a failover and its return within one
    spell are not seen)."""
    engines = sorted(CAUSES)
    lines = []
    if samples:
        blind, engine = longest_blind_spell(samples)
        lines.append(f"  watcher: {len(samples)} samples over "
                     f"{samples[-1][0] - samples[0][0]:.0f} s, longest without an answer "
                     f"{blind:.1f} s ({engine})")
    lines.append(f"  {'engine':<32}{'injected':>10}{'nobody injected':>17}")
    for engine in engines:
        mine = [f for f in failovers if f.engine == engine]
        stray = [f for f in mine if f.cause is None]
        lines.append(f"  {engine:<32}{len(mine) - len(stray):>10}{len(stray):>17}")
    for f in (f for f in failovers if f.cause is None):
        lines.append(f"    nobody injected: {f.engine} {_moved(f.before, f.after)} "
                     f"at +{f.at - started:.0f} s")
    total = sum(1 for f in failovers if f.cause is None)
    lines.append(f"  {'failovers nobody injected':<32}{total:>10}")
    return lines


def longest_blind_spell(samples: list[tuple[float, Leaders]]) -> tuple[float, str]:
    """The longest time between two answers of one engine (samples where it did not
    answer count as blind), and that engine; the run's end closes the last spell."""
    worst = (0.0, "-")
    end = samples[-1][0]
    for engine in sorted({e for _, leaders in samples for e in leaders}):
        answered = [t for t, leaders in samples if leaders.get(engine) is not None]
        points = [samples[0][0], *answered, end]
        spell = max(b - a for a, b in itertools.pairwise(points))
        worst = max(worst, (spell, engine))
    return worst


def _moved(before: object, after: object) -> str:
    """What changed: one leader for another, or how many partitions changed leader."""
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        moved = sum(1 for b, a in zip(before, after, strict=True) if b != a)
        return f"{moved} partition(s) changed leader"
    return f"{before} -> {after}"


class LeaderWatcher:
    """Samples ``probes`` (engine -> a function naming its leader) every ``interval`` s in
    a thread; a probe that fails gives None for that sample."""

    def __init__(self, probes: dict[str, Callable[[], object]], interval: float = 0.5) -> None:
        self._probes = probes
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watcher", daemon=True)
        self.samples: list[tuple[float, Leaders]] = []

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sample: Leaders = {}
            for engine, probe in self._probes.items():
                try:
                    sample[engine] = probe()
                except Exception:  # a node being killed or promoted answers nothing for a while
                    sample[engine] = None
            self.samples.append((time.time(), sample))
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
