"""The Dockerfile and docker-compose.yml cannot be built here (no Docker engine): keep them
honest by reading them against the contract and the service's own settings."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from service.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_whole_system() -> None:
    services = compose()["services"]
    for name in ("kafka", "postgres", "redis", "migrate", "topics", "worker", "prometheus"):
        assert name in services, name
    assert services["worker"]["deploy"]["replicas"] == 3
    assert services["migrate"]["command"] == ["migrate"]
    assert services["worker"]["command"] == ["run"]
    depends = services["worker"]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"


def test_compose_ports_match_the_contract() -> None:
    services = compose()["services"]
    assert "9092:9092" in services["kafka"]["ports"]
    assert "5432:5432" in services["postgres"]["ports"]
    assert "6379:6379" in services["redis"]["ports"]
    assert "9100" in services["worker"]["expose"]


def test_compose_environment_names_real_settings_with_contract_values() -> None:
    env = compose()["services"]["worker"]["environment"]
    fields = set(Settings.model_fields)
    for var in env:
        assert var.startswith("PAYAUTH_") and var[8:].lower() in fields, var
    assert env["PAYAUTH_INPUT_TOPIC"] == "payments.authorizations"
    assert env["PAYAUTH_OUTPUT_TOPIC"] == "payments.authorized"
    assert env["PAYAUTH_DLQ_TOPIC"] == "payments.authorizations.dlq"
    assert env["PAYAUTH_GROUP_ID"] == "cg-payments"
    assert env["PAYAUTH_METRICS_PORT"] == "9100"
    host = env["PAYAUTH_KAFKA_BOOTSTRAP_SERVERS"].split(":")[0]
    assert host in compose()["services"]


def test_prometheus_scrapes_the_workers_and_loads_the_rules() -> None:
    volumes = compose()["services"]["prometheus"]["volumes"]
    assert any(v.startswith("./deploy/prometheus:") for v in volumes)
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    sd = config["scrape_configs"][0]["dns_sd_configs"][0]
    assert sd["names"] == ["worker"] and sd["port"] == 9100
    assert (ROOT / "deploy/prometheus" / Path(config["rule_files"][0]).name).exists()


def test_dockerfile_is_multi_stage_non_root_and_runs_the_worker() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), user
    assert re.search(r"^EXPOSE 9100$", text, re.M)
    # from the wheelhouse or the index, hash-checked either way
    assert text.count("--require-hashes -r /tmp/build/requirements.lock") == 2
    assert 'ENTRYPOINT ["python", "-m", "service"]' in text
    for line in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for path in line.split():
            # a bracketed name is optional (the wheelhouse exists only during make image)
            if "[" not in path:
                assert (ROOT / path).exists(), path


def test_the_image_ships_the_runtime_not_the_dev_tools() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "service/devtools" in ignored and "tests" in ignored
    assert "COPY service/ /app/service/" in (ROOT / "Dockerfile").read_text()


def _pins(text: str) -> dict[str, str]:
    """name==version line -> the whole entry (the pin and its hashes)."""
    entries: dict[str, str] = {}
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for block in re.split(r"\n(?=[a-z0-9])", text):
        first = block.split(" ", 1)[0]
        if "==" in first:
            entries[first.split("==")[0]] = " ".join(block.split())
    return entries


def test_podman_compose_is_hash_pinned_with_the_dev_locks_dependencies() -> None:
    lock = _pins((ROOT / "tests/containers/podman-compose.lock").read_text())
    dev = _pins((ROOT / "requirements-dev.lock").read_text())
    assert set(lock) == {"podman-compose", "python-dotenv", "pyyaml"}
    assert all("--hash=sha256:" in entry for entry in lock.values()), lock
    assert {name: lock[name] for name in ("python-dotenv", "pyyaml")} == \
        {name: dev[name] for name in ("python-dotenv", "pyyaml")}


def test_every_stack_makes_payauths_database_compare_text_byte_by_byte() -> None:
    """Each way of making the database gives it the collation ``payauth migrate`` expects
    (CREATE_OPTIONS; docs/operations.md, "The database's collation")."""
    from service.ops.migrate import COLLATION, CREATE_OPTIONS

    local = (ROOT / "deploy/local/stack.sh").read_text()
    assert f'PG_DB_OPTIONS="{CREATE_OPTIONS}"'.lower() in local.lower()
    assert re.search(r'create database \\"\$PG_DB\\" owner \\"\$me\\" \$PG_DB_OPTIONS', local)
    secure = (ROOT / "deploy/local/secure.sh").read_text()
    assert re.search(r"create database \$SECURE_PG_DB owner payauth_owner \$PG_DB_OPTIONS",
                     secure)
    ha = (ROOT / "deploy/local/ha.sh").read_text()
    assert f"LC_COLLATE={COLLATION} pg_autoctl create postgres" in ha
    initdb = compose()["services"]["postgres"]["environment"]["POSTGRES_INITDB_ARGS"]
    assert f"--lc-collate={COLLATION}" in initdb.split()
    cluster = yaml.safe_load((ROOT / "deploy/k8s/overlays/ha/postgres-cluster.yaml").read_text())
    assert cluster["spec"]["bootstrap"]["initdb"]["localeCollate"] == COLLATION
