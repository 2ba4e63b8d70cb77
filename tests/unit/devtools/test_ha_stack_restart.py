"""The HA chaos run restarts a killed Kafka node only once its port is closed: ha.sh starts
a node only if nothing listens on its port, and a dying node can hold it for a moment."""

from __future__ import annotations

import socket

from service.devtools.processes import port_open


def test_a_port_is_seen_open_while_it_listens_and_closed_after() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert port_open("127.0.0.1", port)
    server.close()
    assert not port_open("127.0.0.1", port)
