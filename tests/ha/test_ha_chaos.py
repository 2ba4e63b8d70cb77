"""The HA smoke (``make ha-smoke``): on the replicated stack (``make ha-up``), one failover
of each engine under load with the chaos run's checker, and its negative control.

- the formation: a primary whose two standbys are both in its synchronous quorum, a commit
  waiting for one of them (``number_sync_standbys`` 1);
- smoke: kill -9 of the PostgreSQL primary (the most advanced secondary is promoted), of a
  Kafka node leading partitions (leadership balanced first), of the Redis master
  (Sentinel promotes the replica), and result writes refused (NOT_ENOUGH_REPLICAS) past the
  delivery timeout; then, each node in a network namespace of its own (as root), one
  partition of each engine: the PostgreSQL primary cut from its monitor and both standbys,
  a Kafka node from the two others, the Redis master from the Sentinels, the workers
  reaching all of them; and a worker cut from Kafka while it reaches PostgreSQL. Every
  invariant holds, the workers retried the refused writes, each partition moved its
  engine's leadership, and the report gives each fault's gap, the partitions the leader
  kill took away and the failovers nobody injected;
- negative controls: the same PostgreSQL failover with asynchronous commits and the
  standbys behind at the kill, and (as root) at a partition of the primary from its monitor
  and standbys. The checker must report the decisions the new primary lacks; a checker
  that passed there could not see the loss synchronous replication prevents.

Not in ``make test``: it needs the replicated stack, which ``make ha-smoke`` starts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.devtools.chaos import ha_stack
from tests.support import stack

KILLS = ("postgres_primary_killed", "kafka_leader_killed", "redis_master_killed",
         "kafka_not_enough_replicas")
# One partition of each engine: the primary cut from its monitor and standbys, a broker
# from the two others, the Redis master from the Sentinels (the workers reach all of them);
# and a worker cut from Kafka, not from PostgreSQL.
PARTITIONS = ("postgres_primary_partitioned", "kafka_broker_partitioned",
              "redis_master_partitioned", "worker_cut_from_kafka")
SMOKE_KINDS = KILLS + PARTITIONS


@pytest.fixture(scope="module", autouse=True)
def ha_stack_up() -> None:
    if os.environ.get("PAYAUTH_HA_SMOKE") != "1":
        pytest.skip("the HA smoke runs through make ha-smoke, which starts its stack")
    if not (stack.ROOT / ".stack/ha.env").exists():
        pytest.fail("the replicated stack is not up: run make ha-smoke (or make ha-up first)")
    ha_stack.pg_primary()  # raises if PostgreSQL does not answer
    assert ha_stack.redis_master() in ha_stack.REDIS_PORTS


def test_each_node_is_in_a_namespace_of_its_own_and_reached_at_its_address() -> None:
    if not ha_stack.namespaced():
        pytest.skip("the replicated stack runs on the loopback (not root, HA_NETNS=0, or "
                    "namespaces refused: make ha-up said which)")
    names = {*ha_stack.NODE_OF_PORT.values(), *ha_stack.WORKER_NODES}
    addresses = {ha_stack.nodes()[name][0] for name in names}
    namespaces = {ha_stack.nodes()[name][1] for name in names}
    assert len(addresses) == len(namespaces) == len(names)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert all(str(namespace) in listed for namespace in namespaces)
    assert "127.0.0.1" not in addresses  # every client reaches them as it would another host
    assert ha_stack.bridge_address() not in addresses


def test_every_commit_waits_for_one_of_two_standbys() -> None:
    """With one standby, pg_auto_failover 2.0 lets the primary take writes alone whenever
    that standby is not a healthy secondary (in every switchover, and after a failover):
    acknowledged commits the promoted node never had (docs/failover.md)."""
    assert ha_stack.pg_number_sync_standbys() == 1
    primary = ha_stack.PG_NODE_PORTS[ha_stack.pg_primary() - 1]
    names = str(ha_stack.pg_query(primary, "SELECT current_setting('synchronous_standby_names')"))
    assert re.fullmatch(r"ANY 1 \(\w+, \w+\)", names), names
    assert ha_stack.pg_healthy()


def _run(tmp_path: Path, **extra: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PAYAUTH_", "CHAOS_", "HA_CHAOS_"))}
    env.update(CHAOS_SEED="3", CHAOS_RATE="60", CHAOS_OUT=str(tmp_path), **extra)
    result = subprocess.run([sys.executable, "-m", "service.devtools.chaos.ha"],
                            cwd=stack.ROOT, env=env, capture_output=True, text=True,
                            timeout=1500)
    return result.returncode, result.stdout + result.stderr


def _section(out: str, title: str) -> str:
    return out.split(title, 1)[1].split("\n\n", 1)[0]


# The run's own bound (the subprocess timeout), not the suite's 300 s: four failovers, each
# Kafka node restarted and leadership balanced again, take several minutes on a busy host.
@pytest.mark.timeout(1800)
def test_one_failover_of_each_engine_holds_every_invariant(tmp_path: Path) -> None:
    kinds = SMOKE_KINDS if ha_stack.namespaced() else KILLS
    code, out = _run(tmp_path, CHAOS_SECONDS="150", CHAOS_FAULTS_PER_KIND="1",
                     HA_CHAOS_KINDS=",".join(kinds))
    assert code == 0, out[-8000:]
    faults = dict(re.findall(r"^  ([a-z_]+)\s+(\d+)$", _section(out, "faults injected by kind"),
                             re.M))
    assert {k: int(v) for k, v in faults.items() if k != "total"} == dict.fromkeys(kinds, 1)
    assert "checker: all invariants hold" in out
    assert not re.search(r"^FAIL  ", out, re.M)
    gaps = _section(out, "gap after each fault")
    for kind in kinds:  # every partition served again after each fault
        line = next(line for line in gaps.splitlines() if line.strip().startswith(kind))
        assert ">" not in line, line
        first, _, every, _ = (float(v) for v in line.split()[1:])
        # a fault that spares some workers (one cut off) lets another commit within the
        # sampling interval: the table's 0.0 is a gap under 50 ms, not a missing one
        assert 0 <= first <= every and every > 0, line
    decided = int(re.search(r"messages decided during the run\s+(\d+)", out).group(1))
    assert decided > 1000, out[-3000:]
    # lifecycles in the load, and holds expire among the failovers
    lifecycles = _section(out, "lifecycles (the log")
    assert int(re.search(r"lifecycle messages sent \(lc_\*\)\s+(\d+)", lifecycles)
               .group(1)) > 100, lifecycles
    assert re.search(r"holds expire runs, exit 0\s+[1-9]", lifecycles), lifecycles
    # the refused writes were retried, not skipped (an event missing would have failed a
    # check above; this says the fault did refuse them)
    retries = dict(re.findall(r"^  ([a-z_]+)\s+(\d+)$", _section(out, "batch retries by cause"),
                              re.M))
    assert int(retries.get("publish_failed", 0)) > 0, retries
    # the leader kill took partitions' leadership away (balanced first), and the table
    # counts the failovers no fault explains (a finding, reported, not a pass or a fail)
    kills = re.findall(r"^  node (\d)\s+(\d+)$",
                       _section(out, "input/output partitions each kill took away"), re.M)
    assert len(kills) == 1 and int(kills[0][1]) > 0, kills
    assert re.search(r"^  failovers nobody injected\s+\d+$", out, re.M), out[-3000:]
    if kinds == SMOKE_KINDS:
        # each partition moved its engine's leadership, as the kill did: the primary and
        # the Redis master twice each (the watcher attributes both to their faults)
        seen = dict(re.findall(r"^  (postgres primary|redis master)\s+(\d+)\s+\d+$", out, re.M))
        assert int(seen["postgres primary"]) >= 2 and int(seen["redis master"]) >= 2, seen


@pytest.mark.timeout(1500)
def test_negative_control_the_checker_reports_what_an_asynchronous_failover_lost(
        tmp_path: Path) -> None:
    _the_checker_reports_what_the_control_lost(tmp_path, "async", "postgres_primary_killed_async")


@pytest.mark.timeout(1500)
def test_negative_control_the_checker_reports_what_a_partitioned_primary_acknowledged_alone(
        tmp_path: Path) -> None:
    """The partition's own control: with asynchronous commits, a primary cut from its
    monitor and standbys (the workers still reaching it) acknowledges decisions until its
    keeper stops it; the promoted standby lacks them, and the checker must say so. With
    synchronous commits (the smoke above) the same cut loses nothing."""
    if not ha_stack.namespaced():
        pytest.skip("the replicated stack runs on the loopback: no partition")
    _the_checker_reports_what_the_control_lost(tmp_path, "partition",
                                               "postgres_primary_partitioned_async")


def _the_checker_reports_what_the_control_lost(tmp_path: Path, control: str,
                                               fault: str) -> None:
    """A negative control run (HA_CHAOS_CONTROL): its fault struck, and the checker failed
    on decisions published that the database does not hold."""
    code, out = _run(tmp_path, HA_CHAOS_CONTROL=control, CHAOS_SECONDS="40")
    assert code == 1, out[-8000:]
    assert fault in _section(out, "faults injected by kind")
    lost = re.search(r"^FAIL  every event names a decision the database holds: (\d+)",
                     out, re.M)
    assert lost, out[-8000:]
    assert int(lost.group(1)) > 0
    assert "checker: INVARIANTS VIOLATED" in out
