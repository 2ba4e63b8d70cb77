"""The HA chaos run's kill of a node: it returns only once the process has exited, so that
the restart after it cannot find the dying node's port still open and start nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.devtools.chaos.ha_stack import _gone, _kill_group_and_wait


def test_a_killed_node_is_gone_when_the_kill_returns() -> None:
    # a node of its own session, as ha.sh starts each; a child of this test, so once
    # killed it stays a zombie until reaped below, and a zombie has exited
    node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        assert not _gone(node.pid)
        _kill_group_and_wait(node.pid, timeout=10)
        assert _gone(node.pid)
    finally:
        node.kill()
        node.wait()
    assert node.returncode == -9


def test_a_pid_no_process_has_is_gone() -> None:
    # pids stay below pid_max, so no process has that one
    assert _gone(int(Path("/proc/sys/kernel/pid_max").read_text()))
