"""Alert rules, the Grafana dashboard and the Kubernetes manifests, checked against what the
service really exports and serves (no cluster or Grafana needed; promtool is)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from service.config import Settings
from service.metrics import REGISTRY
from tests.support.k8s_api import pod_template

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy/prometheus"
K8S = ROOT / "deploy/k8s/base"


def exported_series() -> set[str]:
    names = set()
    for metric in REGISTRY.collect():
        names.add(metric.name)
        if metric.type == "counter":  # the family drops the suffix its samples carry
            names.add(metric.name + "_total")
        for sample in metric.samples:
            names.add(sample.name)
    return names


def recording_rules() -> set[str]:
    groups = yaml.safe_load((PROM / "rules.yml").read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bpayauth[a-z0-9_:]*", expr))


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is needed: `make test-tools` installs it (Debian package 'prometheus')"
    return path


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    check = subprocess.run([promtool(), "check", "rules", "rules.yml"], cwd=PROM,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([promtool(), "test", "rules", "rules_test.yml"], cwd=PROM,
                          capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_rules_cover_the_required_alerts_and_name_real_metrics() -> None:
    groups = yaml.safe_load((PROM / "rules.yml").read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert {"PayauthDuplicateRateHigh", "PayauthConsumerLagGrowing", "PayauthDeadLetters",
            "PayauthRedisDown", "PayauthNoProgress"} <= alerts
    known = exported_series() | recording_rules()
    for rule in rules:
        assert metric_names(rule["expr"]) <= known, rule["expr"]
    duplicate_rate = next(r for r in rules if r.get("record") == "payauth:duplicate_rate:5m")
    assert duplicate_rate["expr"] == ("sum(rate(payauth_duplicates_total[5m])) / "
                                      "sum(rate(payauth_messages_total[5m]))")


def test_every_dashboard_panel_queries_a_metric_the_service_exports() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/payauth.json").read_text())
    known = exported_series() | recording_rules()
    titles = []
    for panel in dashboard["panels"]:
        titles.append(panel["title"].lower())
        exprs = [t["expr"] for t in panel["targets"]]
        assert exprs, panel["title"]
        for expr in exprs:
            names = metric_names(expr)
            assert names and names <= known, (panel["title"], names - known)
    for wanted in ("total processed", "duplicates", "duplicate rate", "dead letters", "lag",
                   "store size", "lookup latency", "decisions"):
        assert any(wanted in t for t in titles), wanted


def test_grafana_provisioning_points_at_the_dashboard_folder() -> None:
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/payauth.yml")
                              .read_text())["providers"][0]
    mounts = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"][
        "volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts


def k8s_docs() -> dict[str, dict]:  # type: ignore[type-arg]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / resource).read_text()):
            docs[doc["kind"]] = doc
    return docs


def test_k8s_resources_exist_and_labels_match() -> None:
    docs = k8s_docs()
    for kind in ("StatefulSet", "ConfigMap", "Job", "PodDisruptionBudget", "PodMonitor",
                 "PrometheusRule", "Service", "CronJob"):
        assert kind in docs, kind
    expire = docs["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert expire["containers"][0]["args"] == ["holds", "expire", "--execute"]
    assert expire["containers"][0]["envFrom"] == \
        docs["Job"]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    sts = docs["StatefulSet"]
    selector = sts["spec"]["selector"]["matchLabels"]
    template = sts["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert docs["PodMonitor"]["spec"]["selector"]["matchLabels"] == selector
    assert docs["Service"]["spec"]["selector"] == selector
    assert sts["spec"]["serviceName"] == docs["Service"]["metadata"]["name"]
    assert sts["spec"]["replicas"] == 3


def test_k8s_worker_uses_static_membership_probes_and_real_settings() -> None:
    docs = k8s_docs()
    container = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["PAYAUTH_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.name"
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    config = docs["ConfigMap"]["data"]
    assert port["containerPort"] == int(config["PAYAUTH_METRICS_PORT"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "metrics"
    assert container["resources"]["requests"]
    fields = set(Settings.model_fields)
    secret = yaml.safe_load((K8S / "secret.example.yaml").read_text())["stringData"]
    for var in [*config, *env, *secret]:
        assert var.startswith("PAYAUTH_") and var[8:].lower() in fields, var
    grace = docs["StatefulSet"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > Settings().shutdown_timeout_seconds
    job = docs["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["migrate"]


def test_prometheus_rule_matches_the_rules_file() -> None:
    rule = k8s_docs()["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((PROM / "rules.yml").read_text())


def test_health_endpoints_answer_as_the_probes_expect() -> None:
    import urllib.error
    import urllib.request

    from service.health import Health, serve_http

    health = Health()
    server = serve_http(0, health)
    port = server.server_address[1]

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert status("/healthz") == 200
        assert status("/readyz") == 503  # no partitions, PostgreSQL not seen yet
        health.set_assigned([("t", 0)])
        health.postgres_ok = True
        assert status("/readyz") == 200
        assert status("/metrics") == 200 and status("/nope") == 404
    finally:
        server.shutdown()


def test_healthz_fails_when_the_poll_loop_or_the_event_loop_is_stuck(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import service.health as health_module

    clock = [1000.0]
    monkeypatch.setattr(health_module.time, "monotonic", lambda: clock[0])
    health = health_module.Health()
    assert health.live() == (True, "ok")
    clock[0] += health_module.STALE_AFTER_SECONDS + 1
    health.loop_heartbeat()
    assert health.live() == (False, "kafka poll loop stuck")
    health.consumer_heartbeat()
    assert health.live() == (True, "ok")
    clock[0] += health_module.STALE_AFTER_SECONDS + 1
    health.consumer_heartbeat()
    assert health.live() == (False, "event loop stuck")


def _pod_specs() -> dict[str, dict]:  # type: ignore[type-arg]
    docs = k8s_docs()
    return {kind: pod_template(docs[kind])["spec"] for kind in ("StatefulSet", "Job", "CronJob")}


def test_every_pod_meets_pod_security_restricted() -> None:
    """What Kubernetes' Pod Security admission requires of a pod in a namespace labelled
    ``pod-security.kubernetes.io/enforce: restricted`` (a bank's namespaces are): a pod of the
    migrate Job or the expiry CronJob without it is refused when the Job creates it."""
    refused = []
    for kind, pod in _pod_specs().items():
        pod_context = pod.get("securityContext", {})
        for container in pod["containers"] + pod.get("initContainers", []):
            context = {**pod_context, **container.get("securityContext", {})}
            where = f"{kind}/{container['name']}"
            if context.get("runAsNonRoot") is not True:
                refused.append(f"{where}: runAsNonRoot")
            if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault",
                                                                     "Localhost"):
                refused.append(f"{where}: seccompProfile")
            if context.get("allowPrivilegeEscalation") is not False:
                refused.append(f"{where}: allowPrivilegeEscalation")
            if "ALL" not in context.get("capabilities", {}).get("drop", []):
                refused.append(f"{where}: capabilities.drop ALL")
    assert refused == []
