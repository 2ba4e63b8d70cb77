"""The local Kubernetes API server of ``make k8s-api`` (deploy/local/k8s-api.sh): its kubectl
(of the server's release) and its kubeconfig, for the deploy tests."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / ".stack/k8s"
KUBECTL = STATE / "bin/kubectl"
KUBECONFIG = STATE / "kubeconfig"


def kubectl_binary() -> str | None:
    """The kubectl of the pinned release when ``make k8s-api`` has built it, else one on
    PATH (for ``kubectl kustomize``, which needs no server)."""
    return str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")


def kustomize(directory: Path, kubectl: str | None = None) -> list[dict[str, Any]]:
    """The kustomization as ``kubectl apply -k`` sends it (``kubectl``: the binary to use,
    else ``kubectl_binary()``)."""
    built = subprocess.run([kubectl or str(kubectl_binary()), "kustomize", str(directory)],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    """A StatefulSet's, Job's or CronJob's pod template (a CronJob's is its Job's)."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return dict(spec["template"])


@dataclass(frozen=True)
class ApiServer:
    kubectl: str
    kubeconfig: Path

    @classmethod
    def local(cls) -> ApiServer | None:
        """The local server when it answers its readiness check, else None."""
        if not (KUBECTL.exists() and KUBECONFIG.exists()):
            return None
        server = cls(str(KUBECTL), KUBECONFIG)
        ready = server.run("get", "--raw", "/readyz", "--request-timeout=10s")
        return server if ready.returncode == 0 else None

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        # The discovery cache beside the kubeconfig: `make k8s-api-down` removes both, so a
        # new server on the same port is never described by the last one's cache.
        return subprocess.run([self.kubectl, "--kubeconfig", str(self.kubeconfig),
                               "--cache-dir", str(self.kubeconfig.parent / "cache"), *args],
                              input=stdin, capture_output=True, text=True, timeout=120)

    def apply(self, docs: list[dict[str, Any]], *extra: str,
              ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply --server-side --validate=strict``, as a user applies the
        manifests (``extra``: ``--dry-run=server`` for a negative control)."""
        return self.run("apply", "--server-side", "--validate=strict",
                        "--field-manager=payauth-deploy-test", *extra, "-f", "-",
                        stdin=yaml.safe_dump_all(docs))
