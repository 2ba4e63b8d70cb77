"""deploy/k8s/overlays/ha: the worker with CloudNativePG, Strimzi and Redis Sentinel
(OT-CONTAINER-KIT redis-operator). The manifests are read, held to each other (the names and
ports the operators give their Services are the ones the worker's settings name) and to the
service's own settings and durability rules; test_k8s_api_server.py applies them to a real
API server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from service.config import Settings
from tests.support.k8s_api import kubectl_binary, kustomize

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
HA = K8S / "overlays/ha"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((HA / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        if not resource.startswith(".."):
            out += _docs(HA / resource)
    return out


def _one(kind: str) -> dict[str, Any]:
    found = [d for d in _resources() if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} resources"
    return found[0]


def _worker_settings() -> Settings:
    """The worker's settings as the pods get them: base ConfigMap, this overlay's patch,
    the overlay's example Secret (envFrom order: the Secret last)."""
    base = yaml.safe_load((K8S / "base/configmap.yaml").read_text())["data"]
    patch = yaml.safe_load((HA / "configmap-ha.yaml").read_text())["data"]
    secret = _docs(HA / "secret.example.yaml")[0]["stringData"]
    env = {**base, **patch, **secret}
    return Settings(**{k.removeprefix("PAYAUTH_").lower(): v for k, v in env.items()})


def test_every_resource_named_exists_and_parses() -> None:
    kustomization = yaml.safe_load((HA / "kustomization.yaml").read_text())
    assert "../../base" in kustomization["resources"]
    for name in [r for r in kustomization["resources"] if not r.startswith("..")] + \
            [p["path"] for p in kustomization["patches"]]:
        assert (HA / name).is_file(), name
        assert _docs(HA / name)
    kinds = sorted(d["kind"] for d in _resources())
    assert kinds == ["Cluster", "ConfigMap", "Kafka", "KafkaNodePool", "KafkaTopic",
                     "KafkaTopic", "KafkaTopic", "KafkaUser", "RedisReplication",
                     "RedisSentinel"]


def test_the_worker_settings_of_the_overlay_validate() -> None:
    settings = _worker_settings()
    assert settings.redis_sentinels and settings.redis_sentinel_master


def test_postgres_is_three_instances_with_synchronous_replication() -> None:
    cluster = _one("Cluster")
    assert cluster["apiVersion"].startswith("postgresql.cnpg.io/")
    spec = cluster["spec"]
    assert spec["instances"] == 3
    sync = spec["postgresql"]["synchronous"]
    assert sync["method"] in ("any", "first") and sync["number"] >= 1
    assert sync["dataDurability"] == "required"
    assert spec["postgresql"]["parameters"]["synchronous_commit"] == "on"
    # the worker writes through the operator's read-write Service, to the database it made
    url = urlsplit(_worker_settings().database_url.get_secret_value())
    assert url.hostname == f"{cluster['metadata']['name']}-rw"
    assert url.port == 5432
    assert url.path.lstrip("/") == spec["bootstrap"]["initdb"]["database"]
    # the workers' login is a member of the least-privilege role, with its own password
    role = next(r for r in spec["managed"]["roles"] if r["name"] == url.username)
    assert role["login"] is True and role["inRoles"] == ["payauth_worker"]
    login = next(d for d in _docs(HA / "secret.example.yaml")
                 if d["metadata"]["name"] == role["passwordSecret"]["name"])
    assert login["type"] == "kubernetes.io/basic-auth"
    assert login["stringData"]["username"] == role["name"]


def test_migrations_run_as_the_database_owner() -> None:
    """The worker's login cannot create the schema (nor the role it is a member of): the
    migrate Job takes the owner's URL from the Secret CloudNativePG keeps for it."""
    patch = yaml.safe_load((HA / "migrate-job-ha.yaml").read_text())
    env = patch["spec"]["template"]["spec"]["containers"][0]["env"]
    url = next(e for e in env if e["name"] == "PAYAUTH_DATABASE_URL")
    ref = url["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{_one('Cluster')['metadata']['name']}-app", "key": "uri"}


def test_kafka_is_three_nodes_that_keep_acknowledged_writes() -> None:
    kafka, pool = _one("Kafka"), _one("KafkaNodePool")
    name = kafka["metadata"]["name"]
    assert pool["metadata"]["labels"]["strimzi.io/cluster"] == name
    assert pool["spec"]["replicas"] == 3
    assert set(pool["spec"]["roles"]) == {"controller", "broker"}
    config = kafka["spec"]["kafka"]["config"]
    assert config["min.insync.replicas"] == 2
    assert config["default.replication.factor"] == 3
    assert config["unclean.leader.election.enable"] is False
    assert config["auto.create.topics.enable"] is False
    # the worker's bootstrap is the operator's bootstrap Service on a listener whose
    # security is the one the worker speaks
    settings = _worker_settings()
    host, port = settings.kafka_bootstrap_servers.split(":")
    assert host == f"{name}-kafka-bootstrap"
    listener = next(li for li in kafka["spec"]["kafka"]["listeners"] if li["port"] == int(port))
    assert listener["tls"] is True and settings.kafka_security_protocol == "SASL_SSL"
    assert listener["authentication"]["type"] == "scram-sha-512"
    assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"


def test_topics_are_the_contracts_replicated_three_times() -> None:
    settings = _worker_settings()
    topics = {d["metadata"]["name"]: d for d in _resources() if d["kind"] == "KafkaTopic"}
    assert set(topics) == {settings.input_topic, settings.output_topic, settings.dlq_topic}
    for topic in topics.values():
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == \
            _one("Kafka")["metadata"]["name"]
        assert topic["spec"]["replicas"] == 3
        assert topic["spec"]["config"]["min.insync.replicas"] == 2
    # a result goes to the partition of its input's key: same partition count
    assert topics[settings.input_topic]["spec"]["partitions"] == \
        topics[settings.output_topic]["spec"]["partitions"]


def test_the_kafka_user_may_do_what_the_worker_does_and_no_more() -> None:
    settings = _worker_settings()
    user = _one("KafkaUser")
    assert user["metadata"]["name"] == _docs(HA / "secret.example.yaml")[0]["stringData"][
        "PAYAUTH_KAFKA_SASL_USERNAME"]
    assert user["spec"]["authentication"]["type"] == "scram-sha-512"
    acls = {(a["resource"]["type"], a["resource"]["name"]): set(a["operations"])
            for a in user["spec"]["authorization"]["acls"]}
    assert acls == {
        ("topic", settings.input_topic): {"Read", "Describe"},
        ("group", settings.group_id): {"Read", "Describe"},
        ("topic", settings.output_topic): {"Write", "Describe"},
        ("topic", settings.dlq_topic): {"Write", "Describe", "DescribeConfigs"},
    }


def test_redis_is_watched_by_three_sentinels_the_worker_asks() -> None:
    replication, sentinel = _one("RedisReplication"), _one("RedisSentinel")
    assert replication["spec"]["clusterSize"] >= 2  # a master and a replica at least
    assert sentinel["spec"]["clusterSize"] == 3
    config = sentinel["spec"]["redisSentinelConfig"]
    assert config["redisReplicationName"] == replication["metadata"]["name"]
    assert int(config["quorum"]) == 2  # a majority of the three
    settings = _worker_settings()
    # the operator's Sentinel Service is <RedisSentinel name>-sentinel, on 26379
    assert settings.sentinel_addresses() == [(f"{sentinel['metadata']['name']}-sentinel", 26379)]
    assert settings.redis_sentinel_master == config["masterGroupName"]
    # Redis requires the password of one Secret, the Sentinels give that one to the master,
    # and the worker's URL carries it (secret.example.yaml: the same Secret's value)
    secret = replication["spec"]["kubernetesConfig"]["redisSecret"]
    assert config["redisReplicationPassword"]["secretKeyRef"] == secret
    auth = next(d for d in _docs(HA / "secret.example.yaml")
                if d["metadata"]["name"] == secret["name"])
    assert secret["key"] in auth["stringData"]
    url = urlsplit(_worker_settings().redis_url.get_secret_value())
    assert url.password == auth["stringData"][secret["key"]]
    # the Sentinels take no password, so the worker is given none for them
    assert "redisSecret" not in sentinel["spec"]["kubernetesConfig"]
    assert not settings.redis_sentinel_password.get_secret_value()


def test_redis_memory_settings_reach_redis() -> None:
    """RedisReplication takes extra redis.conf lines only from a ConfigMap it names, whose
    key redis-additional.conf is the file Redis includes."""
    name = _one("RedisReplication")["spec"]["redisConfig"]["additionalRedisConfig"]
    config = next(d for d in _resources()
                  if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    lines = config["data"]["redis-additional.conf"].splitlines()
    assert "maxmemory-policy volatile-ttl" in lines
    assert any(line.startswith("maxmemory ") for line in lines)


def test_the_worker_trusts_the_kafka_cluster_ca_where_its_settings_look() -> None:
    patch = yaml.safe_load((HA / "statefulset-ha.yaml").read_text())
    spec = patch["spec"]["template"]["spec"]
    mount = spec["containers"][0]["volumeMounts"][0]
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == f"{_one('Kafka')['metadata']['name']}-cluster-ca-cert"
    ca = Path(_worker_settings().kafka_ssl_ca_location)
    assert ca.parent == Path(mount["mountPath"])
    assert ca.name in {item["path"] for item in volume["secret"]["items"]}


@pytest.mark.skipif(kubectl_binary() is None, reason="no kubectl (make k8s-api builds one)")
def test_kustomize_builds_both_the_base_and_the_overlay() -> None:
    for target in (K8S, HA):
        built = kustomize(target)
        assert "StatefulSet" in [d["kind"] for d in built]
    overlay = built
    worker = next(d for d in overlay if d["kind"] == "StatefulSet")
    assert worker["metadata"]["namespace"] == "payments"
    assert any(v["name"] == "kafka-ca" for v in worker["spec"]["template"]["spec"]["volumes"])
    job = next(d for d in overlay if d["kind"] == "Job")
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"]["name"] == "payauth-pg-app"
    config = next(d for d in overlay
                  if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "payauth-config")
    assert config["data"]["PAYAUTH_REDIS_SENTINEL_MASTER"] == "mymaster"
    assert config["data"]["PAYAUTH_INPUT_TOPIC"] == "payments.authorizations"  # from the base


def _local_kafka_settings() -> dict[str, str]:
    text = (ROOT / "deploy/local/kafka/ha-server.properties").read_text()
    return dict(line.split("=", 1) for line in text.splitlines()
                if "=" in line and not line.startswith("#"))


def test_the_overlay_fails_over_within_the_budget_the_chaos_run_measured() -> None:
    """docs/failover.md: the engines' detection settings of the local replicated stack (the
    ones the HA chaos run measured), the same in the operators' resources wherever the
    operator lets them be set."""
    local = _local_kafka_settings()
    config = _one("Kafka")["spec"]["kafka"]["config"]
    # Strimzi ignores every `broker.` option: the session timeout cannot be carried over
    assert not any(key.startswith("broker.") for key in config)
    for key in ("leader.imbalance.check.interval.seconds",
                "leader.imbalance.per.broker.percentage", "offsets.topic.segment.bytes",
                "controller.quorum.fetch.timeout.ms", "controller.quorum.election.timeout.ms",
                "controller.quorum.election.backoff.max.ms"):
        assert str(config[key]) == local[key], key
    # KIP-1236's floor: twice the active controller's 500 ms fetch wait
    assert int(local["controller.quorum.fetch.timeout.ms"]) >= 1000
    assert config["auto.leader.rebalance.enable"] is True
    assert local["auto.leader.rebalance.enable"] == "true"

    cluster = _one("Cluster")["spec"]
    readiness = cluster["probes"]["readiness"]
    # a dead primary is noticed within about the 2 to 4 s the local monitor takes (its
    # checks failed and 2 s of silence), give or take a probe
    assert cluster["failoverDelay"] == 0
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 5
    assert cluster["switchoverDelay"] <= 60

    ha_sh = (ROOT / "deploy/local/ha.sh").read_text()
    sentinel = _one("RedisSentinel")["spec"]["redisSentinelConfig"]
    local_down = re.search(r"sentinel down-after-milliseconds \$SENTINEL_MASTER (\d+)", ha_sh)
    assert local_down
    assert sentinel["downAfterMilliseconds"] == local_down.group(1)


def test_the_workers_client_follows_a_leader_move_within_seconds() -> None:
    """The librdkafka settings every worker gets (overlay or not): a leader change seen
    within the periodic refresh, a silent broker given up before the card network's 10 s."""
    from service.adapters.kafka.config import client_config

    conf = client_config(_worker_settings())
    assert conf["topic.metadata.refresh.interval.ms"] <= 5_000
    assert conf["metadata.max.age.ms"] >= 3 * conf["topic.metadata.refresh.interval.ms"]
    assert conf["socket.timeout.ms"] < 10_000
    # past the local brokers' fencing of a silent node, so that the leaders have moved
    assert conf["socket.timeout.ms"] > int(_local_kafka_settings()["broker.session.timeout.ms"])
    assert conf["reconnect.backoff.max.ms"] <= 1_000
    assert conf["retry.backoff.max.ms"] <= 1_000


def test_the_ha_runs_group_session_rides_out_its_longest_cut_from_a_broker() -> None:
    """A coordinator's move does not count against a member's session (the new coordinator
    gives each member it loads a whole session), but a cut from the coordinator does: a
    worker cut longer than its session is expelled and its partitions move twice, and with
    every worker cut at once the whole group rebalances (docs/failover.md). The HA run's
    session outlasts its longest cut of the workers from one broker by a beat; a member
    finds a moved coordinator within a few beats of the shortest session the brokers allow."""
    from service.adapters.kafka.config import consumer_config
    from service.devtools.chaos.ha import BROKER_CUT_LONGEST_S, GROUP_SESSION_MS

    deployed = consumer_config(_worker_settings())
    heartbeat = deployed["heartbeat.interval.ms"]
    assert heartbeat * 3 <= 6_000  # group.min.session.timeout.ms, the brokers' floor
    assert BROKER_CUT_LONGEST_S * 1_000 + heartbeat <= GROUP_SESSION_MS
    assert deployed["max.poll.interval.ms"] >= deployed["session.timeout.ms"]
