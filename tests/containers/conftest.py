"""The container tier: the image as users deploy it, against the local stack. It needs a
container engine (docker with a daemon, else podman, which deploy/image/engine.sh installs
from Debian as root); without one it is skipped, saying why. The image is built by
``make image`` (``make test-containers`` does that first), or here when it is missing."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.containers import IMAGE, Container, Engine, NoEngine
from tests.support.stack import ROOT


@pytest.fixture(scope="session")
def engine() -> Engine:
    try:
        found = Engine()
    except NoEngine as exc:
        pytest.skip(f"no container engine here and none could be installed: {exc}")
    if not found.has_image():
        built = subprocess.run([str(ROOT / "deploy/image/build.sh")], capture_output=True,
                               text=True, timeout=1200)
        assert built.returncode == 0, f"make image failed:\n{built.stdout}\n{built.stderr}"
    assert found.has_image(), f"{IMAGE} missing after the build"
    return found


@pytest.fixture
def containers(engine: Engine, tmp_path: Path) -> Iterator[Callable[..., Container]]:
    """Start containers of the image; every one is removed at the end, pass or fail (its
    log kept in the test's tmp_path)."""
    started: list[Container] = []

    def start(settings: dict[str, str], *command: str, grace_seconds: int = 30) -> Container:
        container = Container(engine, settings, *command, grace_seconds=grace_seconds)
        started.append(container)
        return container.start()

    yield start
    for container in started:
        container.remove(log_dir=tmp_path)
