"""The secured stack's tier (``make secure-smoke``): the shared helpers of tests/support,
pointed at the secured stack (``make secure-up``) with the settings it wrote, the worker's
(``.stack/secure.env``) and the administrator's (``.stack/secure-admin.env``).

Each test gets its own database (cloned by the database owner), topics (created by the
Kafka administrator) and group, and the worker principal gets the test's ACLs through
``payauth acls --execute`` (removed afterwards). Every log and command output the tier
writes goes to one directory, which the last test scans for every secret the stack holds.

Not in ``make test``: it needs the secured stack, which ``make secure-smoke`` starts. Run
it on its own (it points tests/support at the secured stack for the whole session).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at run time
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.support import stack
from tests.support.workers import WorkerProcess

STACK = stack.ROOT / ".stack"
TLS = STACK / "secure" / "tls"
SECRETS_FILE = STACK / "secure" / "secrets"


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def secrets() -> list[str]:
    """Every password the secured stack made (``secure.sh``'s ``secrets`` file)."""
    return [line.split("=", 1)[1] for line in SECRETS_FILE.read_text().splitlines()
            if "=" in line]


@pytest.fixture(scope="session")
def worker_settings() -> dict[str, str]:
    return read_env(STACK / "secure.env")


@pytest.fixture(scope="session")
def admin_settings() -> dict[str, str]:
    return read_env(STACK / "secure-admin.env")


@pytest.fixture(scope="session")
def tier_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secure-tier-logs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scan of the tier's logs runs last, after everything that wrote one."""
    items.sort(key=lambda item: item.name.startswith("test_no_secret_in_any_log"))


@pytest.fixture(scope="session")
def live_stack(worker_settings: dict[str, str], admin_settings: dict[str, str]) -> None:
    if os.environ.get("PAYAUTH_SECURE_SMOKE") != "1":
        pytest.skip("the secured tier runs through make secure-smoke, which starts its stack")
    missing = [name for name, port in (("PostgreSQL", 25432), ("Redis", 36379),
                                       ("Kafka", 29092)) if not stack.port_open("127.0.0.1", port)]
    if missing:
        pytest.fail(f"{', '.join(missing)} of the secured stack not running: make secure-up")
    admin_kafka = {
        "bootstrap.servers": admin_settings["PAYAUTH_KAFKA_BOOTSTRAP_SERVERS"],
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": admin_settings["PAYAUTH_KAFKA_SASL_USERNAME"],
        "sasl.password": admin_settings["PAYAUTH_KAFKA_SASL_PASSWORD"],
        "ssl.ca.location": admin_settings["PAYAUTH_KAFKA_SSL_CA_LOCATION"],
    }
    stack.use(stack.Endpoints(
        kafka=admin_kafka,
        pg_admin_dsn=stack.with_database(admin_settings["PAYAUTH_DATABASE_URL"], "postgres"),
        redis_url=worker_settings["PAYAUTH_REDIS_URL"],
        worker_settings=worker_settings,
        worker_dsn=worker_settings["PAYAUTH_DATABASE_URL"],
    ))
    asyncio.run(stack.ensure_template())


def payauth_as(settings: dict[str, str], world: stack.Env, tier_logs: Path, *args: str,
               **overrides: str) -> subprocess.CompletedProcess[str]:
    """``payauth ARGS`` with ``settings`` (the worker's or the administrator's) against the
    test's world; its output is kept with the tier's logs for the final scan."""
    env = {**world.worker_env(), **settings,
           "PAYAUTH_GROUP_ID": world.group_id, "PAYAUTH_INPUT_TOPIC": world.input_topic,
           "PAYAUTH_OUTPUT_TOPIC": world.output_topic, "PAYAUTH_DLQ_TOPIC": world.dlq_topic,
           "PAYAUTH_DATABASE_URL": stack.with_database(settings["PAYAUTH_DATABASE_URL"],
                                                       world.database),
           "PAYAUTH_LOG_LEVEL": "WARNING", **overrides}
    result = subprocess.run([sys.executable, "-m", "service", *args], cwd=stack.ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    with (tier_logs / "commands.log").open("a") as out:
        out.write(f"$ payauth {' '.join(args)}\n{result.stdout}{result.stderr}\n")
    return result


def grant_worker(admin_settings: dict[str, str], world: stack.Env, tier_logs: Path,
                 principal: str = "User:worker", group: str | None = None) -> None:
    done = payauth_as(admin_settings, world, tier_logs, "acls", "--principal", principal,
                      "--execute", PAYAUTH_GROUP_ID=group or world.group_id)
    assert done.returncode == 0, done.stderr


def drop_acls(names: list[str]) -> None:
    admin = AdminClient(stack.kafka_conf())
    filters = [AclBindingFilter(kind, name, ResourcePatternType.LITERAL, None, None,
                                AclOperation.ANY, AclPermissionType.ANY)
               for name in names for kind in (ResourceType.TOPIC, ResourceType.GROUP)]
    for future in admin.delete_acls(filters, request_timeout=30).values():
        future.result()


@pytest.fixture
def env(live_stack: None, admin_settings: dict[str, str],
        tier_logs: Path) -> Iterator[stack.Env]:
    """A database, topics and a group of the test's own, the worker's ACLs on them."""
    suffix = uuid.uuid4().hex[:8]
    world = stack.Env(
        database=asyncio.run(stack.create_database()),
        input_topic=f"s.{suffix}.in", output_topic=f"s.{suffix}.out",
        dlq_topic=f"s.{suffix}.dlq", group_id=f"sg-{suffix}", partitions=4,
    )
    stack.create_topics({world.input_topic: 4, world.output_topic: 4, world.dlq_topic: 1})
    grant_worker(admin_settings, world, tier_logs)
    yield world
    drop_acls([world.input_topic, world.output_topic, world.dlq_topic, world.group_id,
               f"{world.group_id}-other"])
    stack.delete_topics([world.input_topic, world.output_topic, world.dlq_topic])
    asyncio.run(stack.drop_database(world.database))


@pytest.fixture
def spawn_worker(tier_logs: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``payauth run`` with the worker's settings only (and the test's world); its log goes
    with the tier's."""
    started: list[WorkerProcess] = []

    def spawn(world: stack.Env, name: str = "w", **overrides: str) -> WorkerProcess:
        log = tier_logs / f"{world.group_id}-{name}-{len(started)}.log"
        worker = WorkerProcess(world.worker_env(**overrides), log)
        started.append(worker.start())
        return worker

    yield spawn
    for worker in started:
        worker.kill()


@pytest.fixture
def other_ca(tmp_path: Path) -> Path:
    """A CA that signed none of the stack's certificates."""
    key, cert = tmp_path / "other-ca.key", tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-noenc", "-days", "1", "-subj", "/CN=other CA",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert
