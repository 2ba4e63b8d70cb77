"""Liveness and readiness, and the HTTP endpoint that serves them with ``/metrics``.

- ``/healthz``: the consumer thread and the event loop both ticked recently (a stuck poll
  loop or a blocked event loop fails it, and the orchestrator restarts the pod), and some
  Kafka broker was reachable within ``kafka_down_limit`` seconds (a worker that has never
  reached the cluster, e.g. a wrong bootstrap address, says so instead of looking healthy).
- ``/readyz``: no engine refuses the worker (a bad password, a missing ACL or grant, an
  untrusted certificate: named in the answer), a Kafka broker is reachable, partitions are
  assigned, PostgreSQL answers, and no partition's oldest unfinished message is older than
  the stall limit (named in the answer).

A refusal is not an outage: waiting does not cure it, an operator must act. The adapters
report one as it happens (``refused``; often only once: librdkafka, for one, says
GROUP_AUTHORIZATION_FAILED once and then retries in silence) and clear it when the engine
accepts again (``accepted``); the worker's heartbeat repeats each current refusal in one
log line per interval (``report_refusals``) until it is cleared.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.logs import RateLimitedLog
from service.metrics import REGISTRY

STALE_AFTER_SECONDS = 30.0


class Health:
    def __init__(self) -> None:
        now = time.monotonic()
        self._consumer_tick = now
        self._loop_tick = now
        self._assigned: list[tuple[str, int]] = []
        self.postgres_ok = False
        # Partitions whose oldest unfinished message is older than the stall limit.
        self.stalled: list[int] = []
        self._kafka_down_since: float | None = None
        self.kafka_down_limit = 120.0
        # source (e.g. "kafka consumer", "postgres") -> what the engine refused; written from
        # the consumer and delivery threads and the event loop (one dict operation each).
        self._refusals: dict[str, str] = {}
        self._refusal_lines = RateLimitedLog(structlog.get_logger(__name__), 30.0)

    def log_refusals_every(self, seconds: float) -> None:
        self._refusal_lines = RateLimitedLog(structlog.get_logger(__name__), seconds)

    def refused(self, source: str, reason: str) -> None:
        """``source`` is refused by its engine for ``reason`` (no secret in it: the adapters
        pass the engine's error text, which names users, never passwords)."""
        self._refusals[source] = reason
        self._refusal_lines.emit(f"refused:{source}", "engine_refused", level="error",
                                 source=source, reason=reason)

    def accepted(self, source: str) -> None:
        if self._refusals.pop(source, None) is not None:
            structlog.get_logger(__name__).info("engine_accepted", source=source)

    @property
    def refusals(self) -> dict[str, str]:
        return dict(self._refusals)

    def report_refusals(self) -> None:
        """One line per current refusal per interval (called by the worker's heartbeat)."""
        for source, reason in list(self._refusals.items()):
            self._refusal_lines.emit(f"refused:{source}", "engine_refused", level="error",
                                     source=source, reason=reason)

    def consumer_heartbeat(self) -> None:
        self._consumer_tick = time.monotonic()

    def loop_heartbeat(self) -> None:
        self._loop_tick = time.monotonic()

    def kafka_reachable(self, reachable: bool) -> None:
        """From the client's statistics: is any broker connection up?"""
        if reachable:
            self._kafka_down_since = None
        elif self._kafka_down_since is None:
            self._kafka_down_since = time.monotonic()

    def kafka_down_for(self) -> float:
        since = self._kafka_down_since
        return 0.0 if since is None else time.monotonic() - since

    def set_assigned(self, partitions: list[tuple[str, int]]) -> None:
        self._assigned = list(partitions)

    @property
    def assigned(self) -> list[tuple[str, int]]:
        return list(self._assigned)

    def live(self) -> tuple[bool, str]:
        now = time.monotonic()
        if now - self._consumer_tick > STALE_AFTER_SECONDS:
            return False, "kafka poll loop stuck"
        if now - self._loop_tick > STALE_AFTER_SECONDS:
            return False, "event loop stuck"
        if self.kafka_down_for() > self.kafka_down_limit:
            return False, f"no Kafka broker reachable for {self.kafka_down_for():.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        live, why = self.live()
        if not live:
            return False, why
        refusals = self.refusals
        if refusals:
            return False, "; ".join(f"{source} refused: {reason}"
                                    for source, reason in sorted(refusals.items()))
        if self.kafka_down_for() > 0:
            return False, f"no Kafka broker reachable for {self.kafka_down_for():.0f} s"
        if not self._assigned:
            return False, "no partitions assigned"
        if not self.postgres_ok:
            return False, "postgresql not answering"
        if self.stalled:
            return False, f"partitions not making progress: {sorted(self.stalled)}"
        return True, "ok"


def serve_http(port: int, health: Health) -> ThreadingHTTPServer:
    """Start ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` (0: any free port)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = health.live() if path == "/healthz" else health.ready()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes every few seconds would drown the service's own logs

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
