"""docker-compose.yml run for real: its payauth services (the topics job, the migrate job,
three worker replicas) with docker-compose.local-stack.yml pointing them at the local
stack, by `docker compose` where docker answers, else podman-compose (from PyPI,
hash-checked against podman-compose.lock, installed under .stack/tools when missing). The
replicas share one group; `stop` stops them cleanly (each leaves the group as it exits, long
before its session would time out, and its log ends in a clean stop)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import stack
from tests.support.containers import Engine, container_env, group_members, stable_with
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until

TOOLS = stack.ROOT / ".stack/tools"
PODMAN_COMPOSE_LOCK = Path(__file__).with_name("podman-compose.lock")
FILES = ["-f", "docker-compose.yml", "-f", "docker-compose.local-stack.yml"]


@pytest.fixture(scope="module")
def compose(engine: Engine) -> list[str]:
    if engine.name == "docker":
        return ["docker", "compose"]
    binary = TOOLS / "bin/podman-compose"
    if not binary.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(TOOLS)], capture_output=True,
                              text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        # Hash-checked, as the project's own dependencies are; a failed install fails the
        # tier (a skip would pass a compose file nobody ran).
        installed = subprocess.run([str(TOOLS / "bin/pip"), "install", "-q", "--require-hashes",
                                    "-r", str(PODMAN_COMPOSE_LOCK)],
                                   capture_output=True, text=True, timeout=600)
        assert installed.returncode == 0, (f"podman-compose could not be installed from "
                                           f"{PODMAN_COMPOSE_LOCK.name}: "
                                           f"{installed.stderr.strip()[-300:]}")
    return [str(binary)]


@pytest.fixture
def project(env: stack.Env, engine: Engine, compose: list[str]) -> Iterator[list[str]]:
    """The compose command for a project of this test's own, taken down at the end."""
    name = f"payauth-test-{uuid.uuid4().hex[:8]}"
    command = [*compose, "-p", name, *FILES]
    yield command
    subprocess.run([*command, "down", "-t", "5"], cwd=stack.ROOT, env=_environment(env, engine),
                   capture_output=True, timeout=180)
    leftovers = engine("ps", "-aq", "--filter", f"label=com.docker.compose.project={name}")
    for cid in leftovers.stdout.split():
        engine("rm", "-f", cid)


def _environment(env: stack.Env, engine: Engine) -> dict[str, str]:
    """The caller's environment: the override reads the test's world from it."""
    settings = container_env(env)
    return {**engine.env, **{k: v for k, v in settings.items()
                             if k != "PAYAUTH_METRICS_PORT"}}


def _run(command: list[str], env: dict[str, str], *args: str,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command, *args], cwd=stack.ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_compose_runs_the_jobs_and_three_replicas_in_one_group(
        env: stack.Env, engine: Engine, project: list[str], tmp_path: Path) -> None:
    environment = _environment(env, engine)
    jobs = _run(project, environment, "up", "topics", "migrate")
    assert jobs.returncode == 0, jobs.stdout[-3000:] + jobs.stderr[-3000:]
    assert "all present" in jobs.stdout + jobs.stderr  # the test's topics, found
    up = _run(project, environment, "up", "-d", "worker")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    wait_until(lambda: stable_with(env.group_id, 3, env.partitions), 120,
               "three replicas sharing the partitions of one group")

    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    txns = [f"TXN-{uuid.uuid4().hex[:10]}" for _ in range(8)]
    stack.produce(env.input_topic, [(account, encode(auth_message(t, account_id=account)))
                                    for t in txns])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    ledger = stack.fetch(env.dsn, "SELECT txn_id FROM ledger_entries")
    assert sorted(r["txn_id"] for r in ledger) == sorted(txns)

    # `stop`, not `down`: a stopped container keeps its log and exit code, where a log
    # followed through `down` can end before the last lines as the container is removed.
    name = project[project.index("-p") + 1]
    names = engine("ps", "--format", "{{.Names}}",
                   "--filter", "label=com.docker.compose.service=worker",
                   "--filter", f"label=com.docker.compose.project={name}").stdout.split()
    assert len(names) == 3, names
    stop = _run(project, environment, "stop")
    assert stop.returncode == 0, stop.stdout[-3000:] + stop.stderr[-3000:]
    # The session timeout is the default 45 s: an empty group right after `stop` means
    # every replica left it as it stopped.
    assert group_members(env.group_id) == []
    for name in names:
        exit_code = engine("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        log = engine.logs(name)
        (tmp_path / f"{name}.log").write_text(log)
        events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert exit_code == "0", f"{name} exited with {exit_code}: {log[-2000:]}"
        assert [e["exit_code"] for e in events if e["event"] == "worker_stopped"] == [0], \
            log[-2000:]
        assert any(e["event"] == "consumer_closed" for e in events), log[-2000:]
    down = _run(project, environment, "down")
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
