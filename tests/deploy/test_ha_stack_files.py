"""The replicated local stack: deploy/local/ha.sh starts it, the HA chaos run
(service/devtools/chaos/ha_stack.py) finds its nodes by the same ports and names, and each
Kafka node's configuration keeps the durability settings the worker relies on."""

from __future__ import annotations

import re
from pathlib import Path

from service.devtools.chaos import ha_stack

ROOT = Path(__file__).resolve().parents[2]
HA_SH = (ROOT / "deploy/local/ha.sh").read_text()
KAFKA_PROPERTIES = (ROOT / "deploy/local/kafka/ha-server.properties").read_text()


def _array(name: str) -> tuple[int, ...]:
    found = re.search(rf"^{name}=\(([0-9 ]+)\)$", HA_SH, re.M)
    assert found, f"{name} is not an array of ports in ha.sh"
    return tuple(int(p) for p in found.group(1).split())


def _scalar(name: str) -> str:
    found = re.search(rf"^{name}=(\S+)$", HA_SH, re.M)
    assert found, f"{name} is not set in ha.sh"
    return found.group(1)


def test_the_chaos_run_knows_the_ports_ha_sh_uses() -> None:
    assert _array("KAFKA_PORTS") == ha_stack.KAFKA_PORTS
    assert _array("KAFKA_PROXIED_PORTS") == ha_stack.KAFKA_PROXIED_PORTS
    assert _array("KAFKA_PROXY_PORTS") == ha_stack.KAFKA_PROXY_PORTS
    assert _array("KAFKA_CONTROLLER_PORTS") == ha_stack.KAFKA_CONTROLLER_PORTS
    assert _array("PG_NODE_PORTS") == ha_stack.PG_NODE_PORTS
    assert _array("SENTINEL_PORTS") == ha_stack.SENTINEL_PORTS
    assert int(_scalar("PG_MONITOR_PORT")) == ha_stack.PG_MONITOR_PORT
    assert (int(_scalar("REDIS_MASTER_PORT")), int(_scalar("REDIS_REPLICA_PORT"))) \
        == ha_stack.REDIS_PORTS
    assert _scalar("SENTINEL_MASTER") == ha_stack.SENTINEL_MASTER


def test_the_chaos_run_names_the_nodes_ha_net_sh_makes() -> None:
    """Each port's node (ha_stack.NODE_OF_PORT) is one ha_net.sh puts in a namespace, and
    every node it makes is known to the chaos run."""
    net = (ROOT / "deploy/local/ha_net.sh").read_text()
    found = re.search(r"^HA_NODES=\(([a-z0-9 ]+)\)$", net, re.M)
    assert found
    assert set(found.group(1).split()) \
        == set(ha_stack.NODE_OF_PORT.values()) | set(ha_stack.WORKER_NODES)


def test_kafka_nodes_keep_acknowledged_writes() -> None:
    settings = dict(line.split("=", 1) for line in KAFKA_PROPERTIES.splitlines()
                    if "=" in line and not line.startswith("#"))
    assert settings["default.replication.factor"] == "3"
    assert settings["min.insync.replicas"] == "2"
    assert settings["unclean.leader.election.enable"] == "false"
    assert settings["offsets.topic.replication.factor"] == "3"
    assert settings["auto.create.topics.enable"] == "false"
    # the proxied listener advertises the proxy's port, not its own
    assert "PROXIED://@ADDRESS@:@PROXIED_PORT@" in settings["listeners"]
    assert "PROXIED://@PROXY_HOST@:@PROXY_PORT@" in settings["advertised.listeners"]


def test_ha_sh_has_a_start_command_for_each_node_the_chaos_run_restarts() -> None:
    for command in ("kafka-node-up)", "pg-node-up)", "redis-node-up)"):
        assert command in HA_SH
    for name in ("kafka-node-up", "pg-node-up", "redis-node-up"):
        assert f'"{name}"' in (ROOT / "service/devtools/chaos/ha_stack.py").read_text()


def test_pg_auto_failover_promotes_only_after_a_partitioned_primary_stopped_itself() -> None:
    """The monitor lets the promoted standby take writes once the old primary is demoted or
    primary_demote_timeout has passed; a primary cut from the monitor and its standby stops
    taking writes after the keeper's network_partition_timeout. The first must outlast the
    second, or a partitioned primary and the promoted standby take writes at once. (Were
    the old primary slower, it would still acknowledge nothing: no standby receives from
    it, and its commits wait for one; the HA chaos run's partitions hold that.)"""
    monitor = dict(re.findall(r'"pgautofailover\.(\w+)=(\d+)"', HA_SH))
    partition_s = int(_scalar("PG_KEEPER_NETWORK_PARTITION_TIMEOUT"))
    assert int(monitor["primary_demote_timeout"]) > partition_s * 1000
    # and shorter than pg_auto_failover's own 30 s, every second of which a primary that
    # never reports again (a host dead for good, a partition) holds every partition up
    assert int(monitor["primary_demote_timeout"]) <= 15_000
    # a dead primary is noticed within seconds: silent for 2 s, and its checks failed
    silence = int(monitor["node_considered_unhealthy_timeout"])
    assert silence <= 5_000
    # and no shorter than the checks take to mark a refusing node bad: a shorter silence
    # would decide no sooner, only leave a keeper slowed by load nearer a false failover
    period, retries = int(monitor["health_check_period"]), int(monitor["health_check_max_retries"])
    refused = period + retries * int(monitor["health_check_retry_delay"])
    assert silence >= refused
    # a node that does not answer at all: each check also waits out its timeout
    checks = refused + retries * int(monitor["health_check_timeout"])
    assert checks <= 7_000


def test_a_keeper_cut_off_from_the_monitor_is_never_blocked_on_it() -> None:
    """A keeper's call to the monitor that the network swallows must fail within seconds,
    or the keeper never reaches its network_partition_timeout and its primary goes on
    taking the workers' batches for the whole cut: the monitor's URI, which every keeper
    uses, bounds what is sent and left unacknowledged, and a silent connection, to a few
    seconds; and a node made before it is given it."""
    uri = "".join(re.findall(r'MONITOR_URI\+?="([^"]*)"', HA_SH))
    params = dict(re.findall(r"[?&](\w+)=(\w+)", uri))
    assert 0 < int(params["tcp_user_timeout"]) <= 5_000
    silent_s = int(params["keepalives_idle"]) + int(params["keepalives_interval"]) \
        * int(params["keepalives_count"])
    assert silent_s <= 5
    assert 'keeper_config_set "$data" pg_autoctl.monitor "$MONITOR_URI"' in HA_SH


def test_a_primary_cut_off_one_way_drops_its_standbys_within_seconds() -> None:
    """Cut off one way, a primary still receives its standbys' replies: its WAL senders stay
    connected (wal_sender_timeout never fires) and its keeper never counts itself
    partitioned. tcp_user_timeout ends a connection whose data stays unacknowledged, so
    the keeper's network_partition_timeout follows within seconds; the two must stay under
    the monitor's primary_demote_timeout, after which a standby is promoted."""
    settings = dict(re.findall(r'"(\w+)=(\d+)"', HA_SH.split("PG_NODE_SETTINGS=(", 1)[1]
                               .split(")", 1)[0]))
    monitor = dict(re.findall(r'"pgautofailover\.(\w+)=(\d+)"', HA_SH))
    partition_ms = int(_scalar("PG_KEEPER_NETWORK_PARTITION_TIMEOUT")) * 1000
    assert 0 < int(settings["tcp_user_timeout"]) <= 10_000
    assert int(settings["tcp_user_timeout"]) + partition_ms \
        < int(monitor["primary_demote_timeout"])
    assert "ALTER SYSTEM SET ${setting%%=*}" in HA_SH  # each node gets them


def _shell_function(name: str) -> str:
    found = re.search(rf"^{name}\(\) {{(.*?)^}}$", HA_SH, re.M | re.S)
    assert found, f"{name} is not a function in ha.sh"
    return found.group(1)


def test_a_node_trusts_the_hosts_connections_before_they_are_awaited() -> None:
    """A node just created trusts only its nodes' own addresses; in network namespaces the
    host's psql comes from the bridge's, so waiting for it to accept connections before
    the stack's network is trusted waits for ever (seen on a fresh machine)."""
    body = _shell_function("pg_node_up")
    assert "pg_trust_the_stack" in body and "node_psql" in body
    assert body.index("pg_trust_the_stack") < body.index("node_psql")


def test_a_wiped_stack_is_made_anew_as_on_a_new_machine() -> None:
    """`make ha-wipe` deletes what a change of network makes anew (every node's data and
    the keepers' files outside it: one function for both), and the layout, so that the
    next `up` starts from nothing, as CI's does."""
    assert "ha_data_remove" in _shell_function("ha_layout_check")
    wipe = _shell_function("ha_wipe")
    assert "ha_data_remove" in wipe and '"$HA_DIR/layout"' in wipe
    assert "pg_forget_keeper" in _shell_function("ha_data_remove")
    assert re.search(r"^  wipe\) ha_wipe ;;$", HA_SH, re.M)
    lines = (ROOT / "Makefile").read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if line.startswith("ha-wipe:"))
    assert lines[target + 1] == "\t@deploy/local/ha.sh wipe"


def test_postgres_keeps_every_acknowledged_commit_on_two_nodes() -> None:
    """Three data nodes, a commit acknowledged once one of the two standbys has it: with a
    single standby pg_auto_failover 2.0 takes writes on the primary alone in a switchover
    (docs/failover.md), and the Kubernetes overlay's CloudNativePG cluster has three."""
    assert len(_array("PG_NODE_PORTS")) == 3
    assert _scalar("PG_NUMBER_SYNC_STANDBYS") == "1"
    assert "for node in 1 2 3; do pg_node_up" in HA_SH
    overlay = (ROOT / "deploy/k8s/overlays/ha/postgres-cluster.yaml").read_text()
    assert re.search(r"^  instances: 3$", overlay, re.M)
