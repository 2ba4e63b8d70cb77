"""The image itself and the operator commands run from it: its user, what it ships (the
runtime, the migrations and the definitions of sql/; not the dev tools, the tests or pip),
every module importable with the dependencies it carries, and migrate, verify, topics,
replay and explain against the local stack."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

from tests.support import stack
from tests.support.containers import (
    IMAGE,
    Engine,
    container_env,
    database_url,
    run_once,
    with_port,
)
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until

MIGRATIONS = sorted(p.name for p in (stack.ROOT / "migrations").glob("*.sql"))
DEFINITIONS = sorted(p.name for p in (stack.ROOT / "sql").iterdir())

# Run inside the image as its entrypoint would be: import every module of the service
# (a dependency dropped from the lock fails here, not in production at the first message
# that needs it) and report what the image holds.
INSIDE = """
import importlib, json, os, pkgutil, sys
import service
failed = {}
for mod in pkgutil.walk_packages(service.__path__, "service."):
    if mod.name.endswith("__main__"):
        continue  # it runs the command line
    try:
        importlib.import_module(mod.name)
    except Exception as exc:
        failed[mod.name] = repr(exc)
def importable(name):
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
    "python": list(sys.version_info[:2]),
    "failed": failed,
    "devtools": os.path.exists("/app/service/devtools"),
    "tests": os.path.exists("/app/tests"),
    "migrations": sorted(os.listdir("/app/migrations")),
    "definitions": sorted(os.listdir("/app/sql")),
    "pip": importable("pip"), "setuptools": importable("setuptools"),
    "app_writable": os.access("/app", os.W_OK),
}))
"""


def test_the_image_runs_as_its_own_user_and_ships_the_runtime_only(engine: Engine) -> None:
    done = run_once(engine, {}, "-c", INSIDE, entrypoint="python")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["uid"] == 10001 and seen["gid"] == 10001, "not the image's own user"
    assert seen["failed"] == {}, "modules that do not import in the image"
    assert seen["python"] == [3, 11]
    assert seen["migrations"] == MIGRATIONS
    assert seen["definitions"] == DEFINITIONS
    assert not seen["devtools"] and not seen["tests"]
    assert not seen["pip"] and not seen["setuptools"]
    assert not seen["app_writable"], "the code is writable by the process that runs it"

    image = engine.inspect_image()
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["python", "-m", "service"]
    assert config["Cmd"] == ["run"]
    assert config.get("StopSignal") in ("SIGTERM", "15")
    # kept only in the docker image format (podman's OCI default drops it)
    # (docker reports it in Config, podman beside it)
    health = config.get("Healthcheck") or image.get("Healthcheck") or {}
    assert any("/healthz" in part for part in health.get("Test", [])), image


def test_the_worker_refuses_a_bad_setting_in_one_line(engine: Engine) -> None:
    done = run_once(engine, {"PAYAUTH_METRICS_PORT": "not-a-port"}, "verify")
    assert done.returncode != 0
    assert "PAYAUTH_METRICS_PORT" in done.stdout + done.stderr


def test_two_containers_migrate_one_database_at_once(engine: Engine) -> None:
    name = asyncio.run(stack.create_database(template=None, prefix="payauth_c_"))
    try:
        world = stack.Env(database=name, input_topic="-", output_topic="-", dlq_topic="-",
                          group_id="-", partitions=1)
        settings = {"PAYAUTH_DATABASE_URL": database_url(world), "PAYAUTH_LOG_LEVEL": "INFO"}
        args = ["run", "--rm", "--network=host", "--no-healthcheck",
                "-e", f"PAYAUTH_DATABASE_URL={settings['PAYAUTH_DATABASE_URL']}",
                IMAGE, "migrate"]
        both = [subprocess.Popen([engine.name, *args], env=engine.env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for _ in range(2)]
        outputs = [p.communicate(timeout=300)[0] for p in both]
        assert [p.returncode for p in both] == [0, 0], outputs
        rows = stack.fetch(world.dsn, "SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == MIGRATIONS, "each migration applied once"
        rows = stack.fetch(world.dsn, "SELECT file FROM schema_definitions ORDER BY file")
        assert [r["file"] for r in rows] == sorted(d for d in DEFINITIONS if d.endswith(".sql"))
        verified = run_once(engine, settings, "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        asyncio.run(stack.drop_database(name))


def test_topics_replay_explain_and_verify_from_the_image(env: stack.Env, engine: Engine,
                                                        containers, tmp_path: Path) -> None:
    # topics: creates what the settings name, and says so; a second run finds them all
    suffix = uuid.uuid4().hex[:8]
    fresh = {"PAYAUTH_INPUT_TOPIC": f"c.{suffix}.in", "PAYAUTH_OUTPUT_TOPIC": f"c.{suffix}.out",
             "PAYAUTH_DLQ_TOPIC": f"c.{suffix}.dlq"}
    try:
        created = run_once(engine, container_env(env, **fresh), "topics", "--partitions", "3")
        assert created.returncode == 0, created.stderr
        assert "created" in created.stdout and fresh["PAYAUTH_INPUT_TOPIC"] in created.stdout
        assert stack.end_offsets(fresh["PAYAUTH_INPUT_TOPIC"], 3) == {0: 0, 1: 0, 2: 0}
        again = run_once(engine, container_env(env, **fresh), "topics", "--partitions", "3")
        assert again.returncode == 0 and "all present" in again.stdout, again.stdout
    finally:
        stack.delete_topics(list(fresh.values()))

    # a worker container decides three purchases
    account = f"ACC-{suffix}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    txns = [f"TXN-{suffix}-{i}" for i in range(3)]
    stack.produce(env.input_topic, [(account, encode(auth_message(t, account_id=account)))
                                    for t in txns])
    worker = containers(with_port(container_env(env)))
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert worker.stop() == 0
    committed = stack.committed_offsets(env.group_id, env.input_topic, env.partitions)

    explained = run_once(engine, container_env(env), "explain", txns[0])
    assert explained.returncode == 0, explained.stderr
    assert txns[0] in explained.stdout and "APPROVED" in explained.stdout
    unknown = run_once(engine, container_env(env), "explain", f"TXN-{suffix}-nobody")
    assert unknown.returncode == 1

    replay = run_once(engine, container_env(env), "replay", "--to-earliest")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    total = next(line for line in replay.stdout.splitlines() if line.split()[:1] == ["total"])
    assert total.split()[-1] == "3", replay.stdout
    assert stack.committed_offsets(env.group_id, env.input_topic, env.partitions) == committed, \
        "a dry run changed the committed offsets"

    verified = run_once(engine, container_env(env), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    ledger = stack.fetch(env.dsn, "SELECT count(*) AS n FROM ledger_entries")
    assert ledger[0]["n"] == 3


def test_probes_answer_as_kubelet_and_the_engine_call_them(env: stack.Env, containers) -> None:
    good = containers(with_port(container_env(env)))
    wait_until(lambda: good.http_get("/readyz")[0] == 200, 90, "the worker to be ready")
    assert good.http_get("/healthz")[0] == 200
    check = good.healthcheck()
    assert check.returncode == 0, check.stdout + check.stderr

    # refused by the database (a role that does not exist): alive, never ready
    refused = containers(with_port(container_env(
        env, PAYAUTH_DATABASE_URL=f"postgresql://nobody_{uuid.uuid4().hex[:6]}@localhost:5432/"
                                  f"{env.database}")))
    wait_until(lambda: [e for e in refused.events("engine_refused")
                        if e.get("source") == "postgres"], 60, "the refusal named in the log")
    status, body = refused.http_get("/readyz")
    assert status == 503, (status, body)
    assert "postgres refused" in body, body
    assert good.running() and refused.running()
