"""Containers of the payauth image, run by the project's engine (``deploy/image/engine.sh``:
docker when a daemon answers, else podman with the project's configuration) on the host
network, so they reach the local stack on ``localhost`` as the host's processes do."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from confluent_kafka.admin import AdminClient

from tests.support.stack import BOOTSTRAP, PG_ADMIN_DSN, ROOT, Env, free_port

IMAGE = os.environ.get("PAYAUTH_TEST_IMAGE", "payauth:local")
ENGINE_SCRIPT = ROOT / "deploy/image/engine.sh"
LABEL = "payauth.test"


class NoEngine(RuntimeError):
    """No container engine answers here and none could be installed."""


class Engine:
    """The engine binary with the environment the project's script gives it."""

    def __init__(self) -> None:
        which = subprocess.run([str(ENGINE_SCRIPT), "--which"], capture_output=True,
                               text=True, timeout=600)
        if which.returncode != 0:
            raise NoEngine(which.stderr.strip().splitlines()[-1] if which.stderr.strip()
                           else "deploy/image/engine.sh found no engine")
        self.name = which.stdout.strip()
        lines = subprocess.run([str(ENGINE_SCRIPT), "--env"], capture_output=True, text=True,
                               timeout=60, check=True).stdout.splitlines()
        self.env = {**os.environ, **dict(line.split("=", 1) for line in lines if "=" in line)}

    def __call__(self, *args: str, timeout: float = 180,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.name, *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=check)

    def logs(self, container: str) -> str:
        """What ``container`` wrote, stdout and stderr."""
        done = self("logs", container)
        return done.stdout + done.stderr

    def has_image(self, image: str = IMAGE) -> bool:
        return self("image", "inspect", image).returncode == 0

    def inspect_image(self, image: str = IMAGE) -> dict[str, Any]:
        out = self("image", "inspect", image, check=True).stdout
        return dict(json.loads(out)[0])


def database_url(env: Env) -> str:
    """The test's database URL with the role named: in the image the process runs as its
    own user, and a URL without a user name would log in under that name."""
    user = urlsplit(PG_ADMIN_DSN).username or getpass.getuser()
    parts = urlsplit(env.dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def container_env(env: Env, **overrides: str) -> dict[str, str]:
    """The worker's settings for a container: the test's world, nothing of the host's."""
    settings = {k: v for k, v in env.worker_env().items() if k.startswith("PAYAUTH_")}
    settings["PAYAUTH_DATABASE_URL"] = database_url(env)
    settings.update(overrides)
    return settings


class Container:
    """One container of the image: started detached, observed from outside, removed by
    the fixture that made it (even when the test fails)."""

    def __init__(self, engine: Engine, settings: dict[str, str], *command: str,
                 name: str | None = None, grace_seconds: int = 30) -> None:
        self.engine = engine
        self.name = name or f"payauth-test-{uuid.uuid4().hex[:10]}"
        self.settings = settings
        self.command = command or ("run",)
        self.grace_seconds = grace_seconds
        self.port = int(settings.get("PAYAUTH_METRICS_PORT") or 0)

    def run_args(self) -> list[str]:
        # the hostname names the Kafka client (payauth-HOSTNAME), as a pod's name does
        args = ["--name", self.name, "--hostname", self.name, "--network=host",
                "--label", f"{LABEL}=1",
                # the probe is run by the test (healthcheck run), not by a timer
                "--health-interval", "disable",
                "--stop-timeout", str(self.grace_seconds)]
        for key, value in self.settings.items():
            args += ["-e", f"{key}={value}"]
        return args

    def start(self) -> Container:
        started = self.engine("run", "-d", *self.run_args(), IMAGE, *self.command)
        assert started.returncode == 0, started.stderr
        return self

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.raw_logs().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def raw_logs(self) -> str:
        return self.engine.logs(self.name)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def state(self) -> dict[str, Any]:
        out = self.engine("inspect", self.name, "--format", "{{json .State}}", check=True)
        return dict(json.loads(out.stdout))

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def http_get(self, path: str) -> tuple[int, str]:
        """GET as a kubelet's httpGet probe does: from outside, on the pod's port."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """The image's own HEALTHCHECK, run by the engine as its timer would."""
        return self.engine("healthcheck", "run", self.name, timeout=60)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after the grace period; the container's exit code."""
        done = self.engine("stop", "-t", str(self.grace_seconds), self.name,
                           timeout=self.grace_seconds + 60)
        assert done.returncode == 0, done.stderr
        return self.exit_code()

    def kill(self) -> int:
        done = self.engine("kill", "-s", "KILL", self.name)
        assert done.returncode == 0, done.stderr
        return self.wait()

    def wait(self, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} still running after {timeout}s")
            time.sleep(0.2)
        return self.exit_code()

    def exit_code(self) -> int:
        return int(self.state()["ExitCode"])

    def remove(self, log_dir: Path | None = None) -> None:
        if log_dir is not None:
            (log_dir / f"{self.name}.log").write_text(self.raw_logs())
        self.engine("rm", "-f", "-v", self.name, timeout=120)


def run_once(engine: Engine, settings: dict[str, str], *command: str,
             entrypoint: str | None = None, timeout: float = 180,
             ) -> subprocess.CompletedProcess[str]:
    """``engine run --rm IMAGE COMMAND``: an operator command (migrate, verify, ...) in a
    container that is gone when it returns."""
    args = ["run", "--rm", "--network=host", "--label", f"{LABEL}=1", "--no-healthcheck"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    for key, value in settings.items():
        args += ["-e", f"{key}={value}"]
    return engine(*args, IMAGE, *command, timeout=timeout)


def with_port(settings: dict[str, str]) -> dict[str, str]:
    """Each container on the host network serves on a port of its own."""
    return {**settings, "PAYAUTH_METRICS_PORT": str(free_port())}


_admin: list[AdminClient] = []


def group_members(group_id: str) -> list[tuple[str, list[int]]]:
    """(client id, assigned partitions) of each member of the group now."""
    if not _admin:
        _admin.append(AdminClient({"bootstrap.servers": BOOTSTRAP}))
    admin = _admin[0]
    description = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id]
    try:
        result = description.result()
    except Exception:
        return []
    return [(m.client_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
            for m in result.members]


def stable_with(group_id: str, members: int, partitions: int) -> bool:
    """The group has ``members`` members, every partition is assigned to one and each has
    some (cooperative rebalancing hands partitions over in rounds)."""
    now = group_members(group_id)
    assigned = sorted(p for _, parts in now for p in parts)
    return (len(now) == members and assigned == list(range(partitions))
            and all(parts for _, parts in now))
