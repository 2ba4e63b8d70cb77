"""The HA overlay's operator resources against their operators' published CRDs
(tests/deploy/crds: each file names its source and commit). An apiVersion the CRD no longer
serves is refused by the API server at `kubectl apply`; a field its schema does not know is
dropped (or refused, with strict field validation) and the operator never sees it. Both are
checked here without a cluster, as the API server checks them: the structural schema's
types, enums, bounds and required fields, unknown fields refused wherever the schema lists
an object's properties and does not say to keep unknown ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HA = ROOT / "deploy/k8s/overlays/ha"
CRDS = Path(__file__).parent / "crds"


def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[(crd["group"], crd["kind"])] = crd
    return out


def _resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((HA / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        if not name.startswith(".."):
            docs += [d for d in yaml.safe_load_all((HA / name).read_text()) if d]
    return docs


def problems(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """What the API server would refuse or drop in ``value`` (an empty list: nothing)."""
    found: list[str] = []
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            found.append(f"{path}: {value!r} is neither an integer nor a string")
        return found
    checks = {"object": dict, "array": list, "string": str, "boolean": bool,
              "integer": int, "number": int | float}
    if kind in checks and (not isinstance(value, checks[kind])
                           or (kind in ("integer", "number") and isinstance(value, bool))):
        return [f"{path or '.'}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} not one of {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        found.append(f"{path}: {value} below the minimum {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        found.append(f"{path}: {value} above the maximum {schema['maximum']}")
    if kind == "array":
        for i, item in enumerate(value):
            found += problems(item, schema.get("items", {}), f"{path}[{i}]")
    if kind == "object":
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{path}.{name}: required")
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if properties is not None and name in properties:
                found += problems(item, properties[name], f"{path}.{name}")
            elif isinstance(extra, dict):
                found += problems(item, extra, f"{path}.{name}")
            elif properties is not None and not schema.get(
                    "x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{name}: unknown field")
    return found


def _check(resource: dict[str, Any]) -> list[str]:
    group, _, version = resource["apiVersion"].rpartition("/")
    crd = _crds()[(group, resource["kind"])]
    served = {v["name"]: v for v in crd["versions"] if v["served"]}
    if version not in served:
        return [f"{resource['apiVersion']} is not served by {crd['name']} "
                f"(served: {', '.join(served)})"]
    return problems(resource, served[version]["schema"])


def _operator_resources() -> list[dict[str, Any]]:
    """The overlay's resources whose CRD is vendored here (docs/containers.md names the
    ones still to vendor)."""
    kinds = set(_crds())
    return [r for r in _resources() if (r["apiVersion"].rpartition("/")[0], r["kind"]) in kinds]


def test_every_strimzi_resource_uses_the_version_strimzi_serves() -> None:
    """Strimzi's CRDs of one release serve the same versions (1.0: v1 only); the KafkaUser
    CRD vendored here says which."""
    served = [v["name"] for v in _crds()[("kafka.strimzi.io", "KafkaUser")]["versions"]
              if v["served"]]
    strimzi = [r for r in _resources() if r["apiVersion"].startswith("kafka.strimzi.io/")]
    assert sorted(r["kind"] for r in strimzi) == [
        "Kafka", "KafkaNodePool", "KafkaTopic", "KafkaTopic", "KafkaTopic", "KafkaUser"]
    assert {r["apiVersion"] for r in strimzi} == {f"kafka.strimzi.io/{v}" for v in served}


@pytest.mark.parametrize("resource", _operator_resources(),
                         ids=lambda r: f"{r['kind']}-{r['metadata']['name']}")
def test_the_resource_passes_its_crd_schema(resource: dict[str, Any]) -> None:
    assert _check(resource) == []


def test_the_check_refuses_what_the_api_server_would() -> None:
    user = next(r for r in _resources() if r["kind"] == "KafkaUser")
    assert _check({**user, "apiVersion": "kafka.strimzi.io/v1beta2"}) == [
        "kafka.strimzi.io/v1beta2 is not served by kafkausers.kafka.strimzi.io (served: v1)"]
    typo = {**user, "spec": {**user["spec"], "authentcation": {"type": "tls"}}}
    assert ".spec.authentcation: unknown field" in _check(typo)
    acl = {"resource": {"type": "topic", "name": "t"}, "operations": ["Reed"]}
    bad = {**user, "spec": {**user["spec"],
                            "authorization": {"type": "simple", "acls": [acl]}}}
    assert _check(bad) == [
        ".spec.authorization.acls[0].operations[0]: 'Reed' not one of " + repr(
            _crds()[("kafka.strimzi.io", "KafkaUser")]["versions"][0]["schema"]["properties"]
            ["spec"]["properties"]["authorization"]["properties"]["acls"]["items"]
            ["properties"]["operations"]["items"]["enum"])]
    assert _check({**user, "spec": {}}) == []  # nothing required inside spec
    assert _check({k: v for k, v in user.items() if k != "spec"}) == [".spec: required"]
