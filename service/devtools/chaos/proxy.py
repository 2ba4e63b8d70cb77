"""A loopback TCP proxy that a test or the chaos run can cut, pause and restore: real network
faults between the worker and a dependency without stopping the dependency for every other
user of the stack. ``cut`` resets every connection and refuses new ones (a crashed or
unreachable server); ``pause`` holds every byte in flight (a frozen server: the client's
timeouts must fire)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1",
                 listen_port: int = 0, connect_timeout: float = 5,
                 listen_host: str = "127.0.0.1") -> None:
        """``listen_port`` 0: any free port (read ``port``). ``connect_timeout`` bounds the
        connection to the target only: a connection through the proxy may then stay idle
        as long as its ends like, as on a real network."""
        self._target = (target_host, target_port)
        self._connect_timeout = connect_timeout
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_host, listen_port))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._up = True
        self._paused = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=self._connect_timeout)
            except OSError:
                client.close()
                continue
            # create_connection's timeout stays on the socket for every recv after it: an
            # upstream quiet that long (an idle pool connection, a paused broker) would be
            # closed by the proxy, a fault nobody injected
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self._paused and self._up:
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every open connection and refuse new ones."""
        self._up = False
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: the socket's release sends a reset, as a crashed peer or a cut
                # cable would. close() alone does not wake the pipe thread blocked in recv on
                # it, which holds the socket until its next byte; shutdown(SHUT_RD) does,
                # without sending anything itself.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RD)
                s.close()

    def restore(self) -> None:
        self._up = True
        self._paused = False

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def close(self) -> None:
        self.cut()
        self._closed = True
        self._listener.close()
