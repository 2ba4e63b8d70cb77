"""The manifests' operator resources (the HA overlay's engines, the base's PodMonitor and
PrometheusRule) against their operators' published CRDs
(tests/deploy/crds; SOURCES.md there names each release and its sha256). An apiVersion no CRD
serves is refused by the API server at `kubectl apply`; a field its schema does not know is
dropped (or refused, with strict field validation) and the operator never sees it. Both are
checked here without a cluster, with a JSON Schema validator (jsonschema) on each CRD's
openAPIV3Schema, given the two rules of Kubernetes' structural schemas that JSON Schema
lacks: an object whose schema lists `properties` takes no other field unless it says
`x-kubernetes-preserve-unknown-fields`, and `x-kubernetes-int-or-string` takes either.
Not checked (they need an API server): the CEL rules (`x-kubernetes-validations`), `format`,
defaulting and the operators' admission webhooks."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy/k8s/base"
HA = ROOT / "deploy/k8s/overlays/ha"
CRDS = Path(__file__).parent / "crds"
# The groups Kubernetes serves itself: everything else needs a CRD here.
BUILT_IN = {"", "apps", "batch", "policy", "networking.k8s.io", "rbac.authorization.k8s.io"}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large: libyaml if there


@cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=Loader)
        assert crd["kind"] == "CustomResourceDefinition", path.name
        out[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd
    return out


def _resources() -> list[dict[str, Any]]:
    """The resources the base and the overlay list as their own (not their patches)."""
    docs: list[dict[str, Any]] = []
    for directory in (BASE, HA):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for name in kustomization["resources"]:
            if not name.startswith(".."):
                docs += [d for d in yaml.safe_load_all((directory / name).read_text()) if d]
    return docs


def _group(resource: dict[str, Any]) -> str:
    return str(resource["apiVersion"]).rpartition("/")[0]


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a CRD's openAPIV3Schema that a JSON Schema validator holds to what the API
    server does. Only the structural part (properties, items, additionalProperties) is
    walked: an anyOf/allOf/oneOf/not below it validates values and declares no fields."""
    node = copy.copy(schema)
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in node:
        node["type"] = [node["type"], "null"]
    if "properties" in node:
        node["properties"] = {k: structural(v) for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = structural(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = structural(node["items"])
    return node


@cache
def _validator(group: str, kind: str, version: str) -> jsonschema.Draft4Validator:
    crd = _crds()[(group, kind)]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    # OpenAPI 3.0's schema object is JSON Schema draft 4's (exclusiveMinimum a boolean)
    return jsonschema.Draft4Validator(structural(served["schema"]["openAPIV3Schema"]))


def check(resource: dict[str, Any]) -> list[str]:
    """What the API server would refuse or drop in ``resource`` (an empty list: nothing)."""
    group, kind = _group(resource), resource["kind"]
    version = str(resource["apiVersion"]).rpartition("/")[2]
    crd = _crds().get((group, kind))
    if crd is None:
        return [f"no CRD here defines {kind} in {group or 'the core group'}"]
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    if version not in served:
        return [f"{resource['apiVersion']} is not served by {crd['metadata']['name']} "
                f"(served: {', '.join(served)})"]
    errors = _validator(group, kind, version).iter_errors(resource)
    return sorted(f"{e.json_path}: {e.message}" for e in errors)


def _operator_resources() -> list[dict[str, Any]]:
    return [r for r in _resources() if _group(r) not in BUILT_IN]


def _one(kind: str) -> dict[str, Any]:
    return next(r for r in _resources() if r["kind"] == kind)


def test_every_operator_resource_has_its_crd_here() -> None:
    kinds = sorted(r["kind"] for r in _operator_resources())
    assert kinds == ["Cluster", "Kafka", "KafkaNodePool", "KafkaTopic", "KafkaTopic",
                     "KafkaTopic", "KafkaUser", "PodMonitor", "PrometheusRule",
                     "RedisReplication", "RedisSentinel"]
    assert {(_group(r), r["kind"]) for r in _operator_resources()} == set(_crds())


@pytest.mark.parametrize("resource", _operator_resources(),
                         ids=lambda r: f"{r['kind']}-{r['metadata']['name']}")
def test_the_resource_passes_its_crd_schema(resource: dict[str, Any]) -> None:
    assert check(resource) == []


def test_strimzi_resources_use_the_only_version_strimzi_serves() -> None:
    for kind in ("Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser"):
        versions = _crds()[("kafka.strimzi.io", kind)]["spec"]["versions"]
        assert [v["name"] for v in versions if v["served"]] == ["v1"], kind


@pytest.mark.parametrize("kind", ["Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser"])
def test_a_v1beta2_copy_is_refused(kind: str) -> None:
    """What the overlay said before Strimzi 1.0: refused, as the API server refuses it."""
    old = {**_one(kind), "apiVersion": "kafka.strimzi.io/v1beta2"}
    plural = _crds()[("kafka.strimzi.io", kind)]["spec"]["names"]["plural"]
    assert check(old) == [
        f"kafka.strimzi.io/v1beta2 is not served by {plural}.kafka.strimzi.io (served: v1)"]


def test_a_version_the_redis_operator_does_not_serve_is_refused() -> None:
    sentinel = {**_one("RedisSentinel"), "apiVersion": "redis.redis.opstreelabs.in/v1"}
    assert check(sentinel) == ["redis.redis.opstreelabs.in/v1 is not served by "
                               "redissentinels.redis.redis.opstreelabs.in (served: v1beta2)"]


def test_the_old_redis_failover_is_refused_no_crd_serves_it() -> None:
    failover = {"apiVersion": "databases.spotahome.com/v1", "kind": "RedisFailover",
                "metadata": {"name": "payauth-redis"},
                "spec": {"sentinel": {"replicas": 3}, "redis": {"replicas": 2}}}
    assert check(failover) == [
        "no CRD here defines RedisFailover in databases.spotahome.com"]


def test_an_unknown_field_is_refused_wherever_the_schema_lists_the_fields() -> None:
    user = _one("KafkaUser")
    typo = {**user, "spec": {**user["spec"], "authentcation": {"type": "tls"}}}
    assert check(typo) == ["$.spec: Additional properties are not allowed "
                           "('authentcation' was unexpected)"]
    sentinel = _one("RedisSentinel")
    config = {**sentinel["spec"]["redisSentinelConfig"], "masterName": "mymaster"}
    assert check({**sentinel, "spec": {**sentinel["spec"], "redisSentinelConfig": config}}) \
        == ["$.spec.redisSentinelConfig: Additional properties are not allowed "
            "('masterName' was unexpected)"]
    # spotahome's field names are not OT's
    replication = _one("RedisReplication")
    spotahome = {**replication, "spec": {**replication["spec"], "auth": {"secretPath": "x"}}}
    assert check(spotahome) == ["$.spec: Additional properties are not allowed "
                                "('auth' was unexpected)"]


def test_fields_are_free_where_the_schema_keeps_unknown_ones() -> None:
    """Kafka's broker config is a free map in Strimzi's schema: any key passes here, as on
    the API server (Strimzi itself refuses the options it manages)."""
    kafka = _one("Kafka")
    config = {**kafka["spec"]["kafka"]["config"], "some.future.option": 1}
    spec = {**kafka["spec"], "kafka": {**kafka["spec"]["kafka"], "config": config}}
    assert check({**kafka, "spec": spec}) == []


def test_a_wrong_type_or_value_is_refused() -> None:
    user = _one("KafkaUser")
    acl = {"resource": {"type": "topic", "name": "t"}, "operations": ["Reed"]}
    bad = {**user, "spec": {**user["spec"],
                            "authorization": {"type": "simple", "acls": [acl]}}}
    [error] = check(bad)
    assert error.startswith("$.spec.authorization.acls[0].operations[0]: 'Reed' is not one of")
    topic = _one("KafkaTopic")
    assert check({**topic, "spec": {**topic["spec"], "partitions": "12"}}) == [
        "$.spec.partitions: '12' is not of type 'integer'"]
    sentinel = _one("RedisSentinel")
    config = {**sentinel["spec"]["redisSentinelConfig"], "downAfterMilliseconds": 2000}
    assert check({**sentinel, "spec": {**sentinel["spec"], "redisSentinelConfig": config}}) \
        == ["$.spec.redisSentinelConfig.downAfterMilliseconds: 2000 is not of type 'string'"]
    cluster = _one("Cluster")
    sync = {**cluster["spec"]["postgresql"]["synchronous"], "method": "all"}
    pg = {**cluster["spec"]["postgresql"], "synchronous": sync}
    assert check({**cluster, "spec": {**cluster["spec"], "postgresql": pg}}) == [
        "$.spec.postgresql.synchronous.method: 'all' is not one of ['any', 'first']"]


def test_a_required_field_missing_is_refused() -> None:
    replication = _one("RedisReplication")
    spec = {k: v for k, v in replication["spec"].items() if k != "clusterSize"}
    assert check({**replication, "spec": spec}) == [
        "$.spec: 'clusterSize' is a required property"]
    assert check({k: v for k, v in _one("KafkaUser").items() if k != "spec"}) == [
        "$: 'spec' is a required property"]


def test_int_or_string_takes_both_and_nothing_else() -> None:
    cluster = _one("Cluster")
    for ok in ("2Gi", 2):
        resources = {**cluster["spec"]["resources"], "limits": {"memory": ok}}
        assert check({**cluster, "spec": {**cluster["spec"], "resources": resources}}) == []
    resources = {**cluster["spec"]["resources"], "limits": {"memory": [4]}}
    [error] = check({**cluster, "spec": {**cluster["spec"], "resources": resources}})
    assert error.startswith("$.spec.resources.limits.memory: [4] is not valid under any")
