"""The partition faults (service/devtools/chaos/netsplit.py) on real network namespaces: two
namespaces of this test's own, joined by a veth pair on a /24 of its own, a TCP server in
one; each kind of split is put in place on the server's side and the client's connections
are tried. Root only (namespaces); the namespaces are deleted whatever happens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from service.devtools.chaos import netsplit

CLIENT, SERVER = "payauth-test-client", "payauth-test-server"
CLIENT_ADDR, SERVER_ADDR, PORT = "10.77.43.1", "10.77.43.2", 15999



def _namespaces_allowed() -> bool:
    """Root, ip and nft, and a host that lets us make a namespace (a container without
    CAP_NET_ADMIN does not; ha.sh then runs the stack on the loopback too)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
        return False
    probe = subprocess.run(["ip", "netns", "add", "payauth-test-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "payauth-test-probe"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_allowed(),
                                reason="network namespaces need root, ip, nft and a host "
                                       "that allows them")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def pair() -> Iterator[subprocess.Popen[bytes]]:
    for ns in (CLIENT, SERVER):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a killed run's
        _ip("netns", "add", ns)
    server = None
    try:
        _ip("link", "add", "pa-test0", "netns", CLIENT, "type", "veth",
            "peer", "name", "pa-test1", "netns", SERVER)
        for ns, dev, addr in ((CLIENT, "pa-test0", CLIENT_ADDR), (SERVER, "pa-test1", SERVER_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # a server that accepts and keeps every connection
        server = subprocess.Popen(
            ["ip", "netns", "exec", SERVER, sys.executable, "-c",
             "import socket\n"
             f"s = socket.create_server(('0.0.0.0', {PORT}))\n"
             "kept = []\nwhile True:\n    kept.append(s.accept())"])
        deadline = time.monotonic() + 10
        while not _connects() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield server
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns in (CLIENT, SERVER):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _connects(timeout: float = 1.0) -> bool:
    """Whether the client's namespace opens a connection to the server within ``timeout``."""
    probe = ("import socket, sys\ntry:\n"
             f"    socket.create_connection(('{SERVER_ADDR}', {PORT}), timeout={timeout})\n"
             "except OSError:\n    sys.exit(1)")
    return subprocess.run(["ip", "netns", "exec", CLIENT, sys.executable, "-c", probe],
                          capture_output=True).returncode == 0


def test_a_split_cuts_only_its_peers_and_heals(pair: subprocess.Popen[bytes]) -> None:
    assert _connects()
    netsplit.cut(netsplit.Split(SERVER, (CLIENT_ADDR,)))
    assert "drop" in netsplit.faults(SERVER)
    assert not _connects()
    netsplit.heal(SERVER)
    assert netsplit.faults(SERVER) == ""
    assert _connects()
    # another peer's split leaves this client alone
    netsplit.cut(netsplit.Split(SERVER, ("10.77.43.9",)))
    assert _connects()
    netsplit.heal(SERVER)


@pytest.mark.parametrize("direction", ["out", "in"])
def test_one_direction_alone_breaks_a_connection(pair: subprocess.Popen[bytes],
                                                 direction: netsplit.Direction) -> None:
    """out: the server's answers are lost; in: the client's requests are. Either way no
    handshake completes, though half of each exchange goes through."""
    netsplit.cut(netsplit.Split(SERVER, (CLIENT_ADDR,), direction))
    try:
        assert not _connects()
    finally:
        netsplit.heal(SERVER)
    assert _connects()


def test_heal_without_a_fault_is_harmless(pair: subprocess.Popen[bytes]) -> None:
    netsplit.heal(SERVER)
    netsplit.heal(SERVER)
    assert _connects()
