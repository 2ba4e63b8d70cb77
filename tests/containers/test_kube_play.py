"""The StatefulSet's pod spec (deploy/k8s/base/statefulset.yaml) run as a pod with
`podman kube play`: its security context (non-root 10001, read-only root filesystem, no
capabilities, no privilege escalation), its env (the group instance id from the pod's
name) and its probes' endpoints, as written. Changed for this machine only: the image is
the local build, the pod is on the host network (the stack is on localhost), the settings
come from a ConfigMap naming the test's world instead of the cluster's ConfigMap and
Secret, and the metrics port is a free one (named in the probes by number: podman maps no
ports on the host network)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import stack
from tests.support.containers import IMAGE, Engine, container_env, group_members
from tests.support.workers import wait_until

STATEFULSET = stack.ROOT / "deploy/k8s/base/statefulset.yaml"


def pod_from_statefulset(name: str, image: str, config_map: str, port: int) -> dict[str, Any]:
    statefulset = yaml.safe_load(STATEFULSET.read_text())
    template = copy.deepcopy(statefulset["spec"]["template"])
    spec = template["spec"]
    spec["hostNetwork"] = True
    worker = spec["containers"][0]
    worker["image"] = image
    worker["envFrom"] = [{"configMapRef": {"name": config_map}}]
    # On the host network podman refuses port mappings: the pod's port goes, and the probes
    # that named it name its number.
    assert worker.pop("ports") == [{"name": "metrics", "containerPort": 9100}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert worker[probe]["httpGet"]["port"] == "metrics"
        worker[probe]["httpGet"]["port"] = port
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": spec}


@pytest.fixture
def kube_file(engine: Engine, env: stack.Env, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    if engine.name != "podman":
        pytest.skip("kube play is podman's; this machine's engine is docker")
    name = f"payauth-{uuid.uuid4().hex[:6]}"
    settings = container_env(env, PAYAUTH_LOG_LEVEL="INFO")
    port = int(stack.free_port())
    settings["PAYAUTH_METRICS_PORT"] = str(port)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
              "data": settings}
    path = tmp_path / "pod.yaml"
    image = f"localhost/{IMAGE}" if "/" not in IMAGE else IMAGE
    path.write_text(yaml.safe_dump_all([config, pod_from_statefulset(
        name, image, f"{name}-config", port)]))
    yield path, name
    engine("kube", "down", str(path), timeout=120)
    engine("pod", "rm", "-f", name, timeout=120)


def test_the_statefulset_pod_spec_runs_as_written(engine: Engine, env: stack.Env,
                                                   kube_file: tuple[Path, str]) -> None:
    path, name = kube_file
    played = engine("kube", "play", str(path), timeout=180)
    assert played.returncode == 0, played.stdout + played.stderr
    container = f"{name}-worker"
    inspect = engine("inspect", container, "--format",
                     "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} "
                     "{{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}}").stdout.split(" ", 3)
    user, read_only, _, security = inspect
    assert user == "10001:10001" or user == "10001", inspect
    assert read_only == "true", inspect
    assert "no-new-privileges" in security, inspect

    settings_port = int(yaml.safe_load(path.read_text().split("---")[0])["data"][
        "PAYAUTH_METRICS_PORT"])

    def probe(path_: str) -> int:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings_port}{path_}",
                                        timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    try:
        wait_until(lambda: probe("/readyz") == 200, 90, "the pod's readiness endpoint")
    except AssertionError:
        raise AssertionError(engine.logs(container)[-3000:]) from None
    assert probe("/healthz") == 200
    # the instance id from the pod's name (fieldRef metadata.name): static membership
    assert f'"instance":"{name}"' in engine.logs(container), engine.logs(container)[-2000:]
    assert len(group_members(env.group_id)) == 1
    # capabilities: none at all in the running process
    status = engine("exec", container, "python", "-c",
                    "print(open('/proc/1/status').read())").stdout
    caps = {line.split(":")[0]: line.split(":")[1].strip() for line in status.splitlines()
            if line.startswith("Cap")}
    assert caps["CapEff"] == "0000000000000000", caps
    stopped = engine("pod", "stop", "-t", "45", name, timeout=120)
    assert stopped.returncode == 0
    assert '"exit_code":0,"event":"worker_stopped"' in engine.logs(container), \
        engine.logs(container)[-2000:]
