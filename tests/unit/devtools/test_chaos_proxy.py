"""The chaos runs' TCP proxy on loopback: a connection through it stays open while idle
(as on a real network) and carries bytes both ways; a cut resets it at once and refuses
new connections until restored. The target is a plain echo server of this test."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from service.devtools.chaos.proxy import TcpProxy


def _echo_server() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def _reply_after_cut(client: socket.socket) -> bytes:
    """What the client reads once the proxy is cut: nothing, the connection closed or reset
    at once (a socket.timeout, the connection left hanging, fails the test)."""
    try:
        return client.recv(1024)
    except ConnectionError:  # reset or broken pipe: refused either way
        return b""


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(ConnectionResetError):  # a cut resets this side too
        while data := conn.recv(1024):
            conn.sendall(data)


def test_an_idle_connection_outlives_the_connect_timeout() -> None:
    server = _echo_server()
    proxy = TcpProxy(server.getsockname()[1], connect_timeout=0.3)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(b"before")
            assert client.recv(1024) == b"before"
            time.sleep(1.0)  # idle for three connect timeouts
            client.sendall(b"after")
            assert client.recv(1024) == b"after"
    finally:
        proxy.close()
        server.close()


def test_a_cut_refuses_new_connections_until_restored() -> None:
    server = _echo_server()
    proxy = TcpProxy(server.getsockname()[1])
    try:
        proxy.cut()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            assert _reply_after_cut(client) == b""
        proxy.restore()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(b"back")
            assert client.recv(1024) == b"back"
    finally:
        proxy.close()
        server.close()


def test_a_cut_resets_a_quiet_connection_at_once() -> None:
    """The client sends nothing after the cut: the reset still comes, as from a crashed
    server, not only when the client next writes."""
    server = _echo_server()
    proxy = TcpProxy(server.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as client:
            client.sendall(b"ping")
            assert client.recv(1024) == b"ping"
            proxy.cut()
            assert _reply_after_cut(client) == b""
    finally:
        proxy.close()
        server.close()
