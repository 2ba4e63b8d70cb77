"""Both kustomizations (deploy/k8s and its HA overlay) judged by a real Kubernetes API server,
as a user's first ``kubectl apply --server-side --validate=strict`` is: ``make k8s-api`` runs
etcd and kube-apiserver of one pinned release on 127.0.0.1 (deploy/local/k8s-api.sh). What it
checks that the jsonschema tests (test_operator_crds.py) cannot: the operators' CEL rules,
formats and defaults (their CRDs from crds/ installed first), strict field validation of the
built-in types, and Pod Security admission in a namespace that enforces ``restricted``.
No kubelet and no controllers: nothing runs, the server admits or refuses.

``make test`` and ``make test-deploy`` start the server and set PAYAUTH_K8S_API=required, so
that these tests fail, not skip, when it does not answer. Run by hand without it, they skip."""

from __future__ import annotations

import copy
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.k8s_api import ApiServer, kustomize, pod_template

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZATIONS = {"base": ROOT / "deploy/k8s", "ha": ROOT / "deploy/k8s/overlays/ha"}
CRDS = Path(__file__).parent / "crds"
WORKLOADS = ("StatefulSet", "Job", "CronJob")


@pytest.fixture(scope="module")
def api() -> ApiServer:
    server = ApiServer.local()
    if server is None:
        if os.environ.get("PAYAUTH_K8S_API") == "required":
            pytest.fail("no Kubernetes API server answers at .stack/k8s/kubeconfig "
                        "(make k8s-api starts one)")
        pytest.skip("no local Kubernetes API server (make k8s-api starts one)")
    crds = [yaml.safe_load(path.read_text()) for path in sorted(CRDS.glob("*.yaml"))]
    installed = server.apply(crds)
    assert installed.returncode == 0, installed.stderr
    established = server.run("wait", "--for=condition=Established", "--timeout=60s",
                             *(f"crd/{crd['metadata']['name']}" for crd in crds))
    assert established.returncode == 0, established.stderr
    return server


def _namespace(api: ApiServer, purpose: str) -> str:
    """A namespace of its own per test (a Job's pod template is immutable: the same
    manifests re-applied after a change would be refused), enforcing Pod Security
    ``restricted``, with the ``default`` ServiceAccount that the absent controller-manager
    would have created (the ServiceAccount admission refuses a Pod without it)."""
    name = f"payauth-{purpose}-{uuid.uuid4().hex[:6]}"
    made = api.apply([
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name,
                      "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                 "pod-security.kubernetes.io/enforce-version": "latest"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": name}},
    ])
    assert made.returncode == 0, made.stderr
    return name


def _built(api: ApiServer, which: str, namespace: str) -> list[dict[str, Any]]:
    """The kustomization as ``kubectl apply -k`` sends it, moved to ``namespace``."""
    docs = kustomize(KUSTOMIZATIONS[which], api.kubectl)
    for doc in docs:
        assert doc["metadata"].get("namespace") == "payments", doc["metadata"]["name"]
        doc["metadata"]["namespace"] = namespace
    return docs


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in docs if d["kind"] == kind))


def _as_pod(workload: dict[str, Any]) -> dict[str, Any]:
    """The Pod its controller would create: Pod Security only warns about a workload's
    template, and refuses the Pod."""
    template = pod_template(workload)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{workload['metadata']['name']}-pod",
                         "namespace": workload["metadata"]["namespace"],
                         "labels": template.get("metadata", {}).get("labels", {})},
            "spec": template["spec"]}


@pytest.mark.parametrize("which", sorted(KUSTOMIZATIONS))
def test_the_kustomization_is_accepted_with_strict_validation_under_pod_security_restricted(
        api: ApiServer, which: str) -> None:
    namespace = _namespace(api, which)
    docs = _built(api, which, namespace)
    applied = api.apply(docs)
    assert applied.returncode == 0, applied.stderr
    # No warning either: Pod Security, a deprecated field, a field dropped would each warn.
    assert applied.stderr == ""
    stored = api.run("get", "-o", "yaml", "-f", "-", stdin=yaml.safe_dump_all(docs))
    assert stored.returncode == 0, stored.stderr
    items = yaml.safe_load(stored.stdout)["items"]
    assert sorted((i["kind"], i["metadata"]["name"]) for i in items) \
        == sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert all(i["metadata"]["uid"] for i in items)
    if which == "ha":
        # The server applied the operators' schemas: CloudNativePG's defaults are in the
        # stored Cluster although the manifest does not write them.
        cluster = next(i for i in items if i["kind"] == "Cluster")
        assert "logLevel" not in _one(docs, "Cluster")["spec"]
        assert cluster["spec"]["logLevel"] == "info"


@pytest.mark.parametrize("which", sorted(KUSTOMIZATIONS))
def test_every_pod_template_is_admitted_as_a_pod_under_pod_security_restricted(
        api: ApiServer, which: str) -> None:
    namespace = _namespace(api, f"{which}-pods")
    docs = _built(api, which, namespace)
    for kind in WORKLOADS:
        created = api.run("create", "--dry-run=server", "-f", "-",
                          stdin=yaml.safe_dump(_as_pod(_one(docs, kind))))
        assert created.returncode == 0, f"{kind}: {created.stderr}"
        assert created.stderr == "", kind


# ------------------------------------------------------------------ negative controls
# Each refused by the server, on the manifests as built with one thing broken: the checks
# above could not pass with the server failing to look.

@pytest.fixture(scope="module")
def ha_docs(api: ApiServer) -> list[dict[str, Any]]:
    return _built(api, "ha", _namespace(api, "refusals"))


def _refused(api: ApiServer, doc: dict[str, Any]) -> str:
    result = api.apply([doc], "--dry-run=server")
    assert result.returncode != 0, f"{doc['kind']} accepted: {result.stdout}"
    return result.stderr


def test_a_pod_that_runs_as_root_is_refused(api: ApiServer,
                                            ha_docs: list[dict[str, Any]]) -> None:
    pod = _as_pod(_one(ha_docs, "StatefulSet"))
    pod["spec"]["securityContext"] = {**pod["spec"].get("securityContext", {}),
                                      "runAsNonRoot": False, "runAsUser": 0}
    assert 'violates PodSecurity "restricted:latest"' in _refused(api, pod)


def test_an_unknown_field_is_refused_by_strict_validation(
        api: ApiServer, ha_docs: list[dict[str, Any]]) -> None:
    worker = _one(ha_docs, "StatefulSet")
    worker["spec"]["servicename"] = worker["spec"].pop("serviceName")
    assert ".spec.servicename: field not declared in schema" in _refused(api, worker)


def test_a_cronjob_with_a_bad_schedule_is_refused(api: ApiServer,
                                                  ha_docs: list[dict[str, Any]]) -> None:
    cronjob = _one(ha_docs, "CronJob")
    cronjob["spec"]["schedule"] = "61 * * * *"
    assert "spec.schedule" in _refused(api, cronjob)


def test_a_broken_cel_rule_of_cloudnativepg_is_refused(
        api: ApiServer, ha_docs: list[dict[str, Any]]) -> None:
    cluster = _one(ha_docs, "Cluster")
    cluster["spec"]["postgresql"]["synchronous"]["number"] = 0
    assert "The number of synchronous replicas should be greater than zero" \
        in _refused(api, cluster)


def test_a_broken_cel_rule_of_strimzi_is_refused(api: ApiServer,
                                                ha_docs: list[dict[str, Any]]) -> None:
    user = _one(ha_docs, "KafkaUser")
    user["spec"]["authentication"]["validityDays"] = 30  # only for type: tls
    assert "can be configured only with 'type: tls'" in _refused(api, user)
