"""Vendors the operators' published CRDs that tests/deploy/test_operator_crds.py checks the HA
overlay's resources against (and that the deploy tests install into a real API server before
applying both kustomizations), from versioned registry artifacts, hash-checked.

    python tests/deploy/crds/vendor.py     # from the repository root; needs go, mvn, java >= 21

- CloudNativePG, OT-CONTAINER-KIT's redis-operator and the Prometheus Operator: the CRD files
  of the release's Go module, from the Go module proxy (`go mod download`).
- Strimzi publishes its CRD files with its GitHub release, not to a registry. Its build makes them
  with its own generator (io.strimzi:crd-generator) from its API classes (io.strimzi:api), with
  the arguments the release's api POM names; both artifacts are on Maven Central, so the same
  command makes the same files here.

Each archive is checked against the sha256 pinned below before anything is read from it (a new
version means new pins, as for the lock files). The only change to a CRD: every `description`
is dropped (they are two thirds of the bytes and no check reads them); SOURCES.md gives the
sha256 of each CRD as published, so that a reader can compare.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

GO_MODULES = [
    # module, version, sha256 of the module zip, the CRD files in it
    ("github.com/cloudnative-pg/cloudnative-pg", "v1.28.1",
     "3b412d84399775f692954960e2fdbe21a6a72f47c7959ff61f8090c1d0aa54ce",
     ["config/crd/bases/postgresql.cnpg.io_clusters.yaml"]),
    ("github.com/OT-CONTAINER-KIT/redis-operator", "v0.23.0",
     "df60dafe542eed8603c3672991f305da3e8b316d3bba0b16fe3d2e77dfe07aa9",
     ["config/crd/bases/redis.redis.opstreelabs.in_redisreplications.yaml",
      "config/crd/bases/redis.redis.opstreelabs.in_redissentinels.yaml"]),
    # the base's PodMonitor and PrometheusRule: the Prometheus Operator's own CRD files
    ("github.com/prometheus-operator/prometheus-operator", "v0.85.0",
     "0bdb88ed823d0f2e86cf909638439b6ad1da744a228172c7411d9987527dc5d1",
     ["example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
      "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"]),
]

STRIMZI = "1.2.0"
STRIMZI_JARS = {  # Maven Central, io.strimzi
    f"api-{STRIMZI}.jar": "566961ae5e5646a001ae91312beda5cba3a5d467e740e205e1b761754335fe4e",
    f"crd-generator-{STRIMZI}.jar":
        "76bb2430e702a1e6a24c071d26c865d5e9572cbc630d176d3b912033ae23ed00",
}
# The api POM's generate-crd-co-install-v1 execution: its options, and the classes of the
# resources the overlay uses with the file names Strimzi gives them.
STRIMZI_GENERATOR_OPTIONS = [
    "--label", "app:strimzi", "--label", "strimzi.io/crd-install:true",
    "--target-kube", "1.16+", "--crd-api-version", "v1", "--api-versions", "v1",
    "--storage-version", "v1", "--yaml",
]
STRIMZI_CLASSES = {
    "io.strimzi.api.kafka.model.kafka.Kafka": "040-Crd-kafka.yaml",
    "io.strimzi.api.kafka.model.topic.KafkaTopic": "043-Crd-kafkatopic.yaml",
    "io.strimzi.api.kafka.model.user.KafkaUser": "044-Crd-kafkauser.yaml",
    "io.strimzi.api.kafka.model.nodepool.KafkaNodePool": "045-Crd-kafkanodepool.yaml",
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checked(path: Path, expected: str) -> bytes:
    data = path.read_bytes()
    if sha256(data) != expected:
        sys.exit(f"{path.name}: sha256 {sha256(data)}, pinned {expected}: refusing it")
    return data


def without_descriptions(node: Any, in_properties: bool = False) -> Any:
    """The schema without its prose. A `description` key inside `properties` is a field
    named description, and stays."""
    if isinstance(node, dict):
        return {key: without_descriptions(value, key == "properties" and not in_properties)
                for key, value in node.items()
                if in_properties or not (key == "description" and isinstance(value, str))}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


def _go_module(module: str, version: str, pinned: str, work: Path) -> zipfile.ZipFile:
    env = {**os.environ, "GOPATH": str(work / "gopath"), "GOFLAGS": "-mod=mod",
           # the zip is checked against the pin above, the checksum database adds nothing
           "GONOSUMDB": module}
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=env,
                         capture_output=True, text=True, check=False)
    info = json.loads(out.stdout or "{}")
    if out.returncode or "Zip" not in info:
        sys.exit(f"go mod download {module}@{version}: {info.get('Error') or out.stderr}")
    path = Path(info["Zip"])
    _checked(path, pinned)
    return zipfile.ZipFile(path)


def _strimzi(work: Path) -> dict[str, bytes]:
    pom = work / "pom.xml"
    deps = "".join(
        f"<dependency><groupId>io.strimzi</groupId><artifactId>{name}</artifactId>"
        f"<version>{STRIMZI}</version></dependency>" for name in ("api", "crd-generator"))
    pom.write_text('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
                   "</modelVersion><groupId>local</groupId><artifactId>crds</artifactId>"
                   f"<version>1</version><dependencies>{deps}</dependencies></project>")
    libs = work / "libs"
    subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                    f"-DoutputDirectory={libs}"], check=True)
    for jar, pinned in STRIMZI_JARS.items():
        _checked(libs / jar, pinned)
    out = work / "strimzi"
    out.mkdir()
    java = os.environ.get("STRIMZI_JAVA", "java")  # the generator is built for Java 21
    subprocess.run([java, "-cp", f"{libs}/*", "io.strimzi.crdgenerator.CrdGenerator",
                    *STRIMZI_GENERATOR_OPTIONS,
                    *(f"{cls}={out / name}" for cls, name in STRIMZI_CLASSES.items())],
                   check=True)
    return {name: (out / name).read_bytes() for name in STRIMZI_CLASSES.values()}


def _write(published: bytes, source: str) -> tuple[str, str]:
    crd = yaml.safe_load(published)
    spec = crd["spec"]
    name = f"{spec['names']['plural']}.{spec['group']}.yaml"
    header = (f"# {crd['metadata']['name']}, as published: {source}\n"
              f"# sha256 of the CRD as published: {sha256(published)}\n"
              "# Changed: descriptions dropped by tests/deploy/crds/vendor.py (SOURCES.md).\n")
    body = yaml.safe_dump(without_descriptions(crd), sort_keys=False, width=100)
    (HERE / name).write_text(header + body)
    return name, sha256(published)


def main() -> None:
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for module, version, pinned, files in GO_MODULES:
            with _go_module(module, version, pinned, work) as archive:
                for inner in files:
                    source = (f"Go module {module}@{version} (zip sha256 {pinned}), "
                              f"file {inner}")
                    name, digest = _write(archive.read(f"{module}@{version}/{inner}"), source)
                    rows.append((name, source, digest))
        for file, published in _strimzi(work).items():
            source = (f"Strimzi {STRIMZI}, {file} as Strimzi's generator makes it from "
                      f"Maven Central io.strimzi:api:{STRIMZI} (jar sha256 "
                      f"{STRIMZI_JARS[f'api-{STRIMZI}.jar']}) with "
                      f"io.strimzi:crd-generator:{STRIMZI}")
            name, digest = _write(published, source)
            rows.append((name, source, digest))
    for name, source, digest in sorted(rows):
        print(f"{name}\n  {source}\n  published sha256 {digest}")


if __name__ == "__main__":
    main()
