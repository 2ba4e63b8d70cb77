"""structlog set-up: JSON lines (or console), context bound per message with contextvars;
card numbers and secrets masked in every line; librdkafka's own log lines routed through it."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import orjson
import structlog

from service.domain.pan import has_long_digit_run, redact


def _dumps(value: object, default: object = None) -> str:
    return orjson.dumps(value, default=default).decode()  # type: ignore[arg-type]  # callable


def _mask_card_numbers(_logger: object, _method: str,
                       event: structlog.types.EventDict) -> structlog.types.EventDict:
    """The last door out: any top-level text field with a 13+ digit run is masked (error
    texts from libraries may quote an input; the fields the service builds never do)."""
    for key, value in event.items():
        if type(value) is str and len(value) >= 13 and (
                has_long_digit_run(value.encode("utf-8", "replace")) or not value.isascii()):
            event[key] = redact(value)
    return event


# user:password@ in any URL a library quotes back (a connection error naming its DSN).
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]+@", re.IGNORECASE)
_secrets: tuple[str, ...] = ()
MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with every configured secret and every URL's password replaced by ***."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    if "://" in text:
        text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    return text


def _mask_secret_values(_logger: object, _method: str,
                        event: structlog.types.EventDict) -> structlog.types.EventDict:
    """The settings' secrets never leave in a line, whatever field quotes them: error texts
    of libraries are the likely carriers (their own messages are not ours to word)."""
    for key, value in event.items():
        if type(value) is str:
            event[key] = mask_secrets(value)
        elif isinstance(value, list | tuple | dict):
            # Left as it is (a list stays a list in the JSON) unless a secret is inside,
            # looked for in its JSON: a batch's decided line carries a thousand decisions,
            # and orjson writes them out far faster than Python's repr (docs/benchmark.md,
            # "Design figures").
            text = _as_text(value)
            masked = mask_secrets(text)
            if masked != text:
                event[key] = masked
    return event


def _as_text(value: object) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # a key that is not a string
        return str(value)


def configure_logging(fmt: str = "json", level: str = "INFO",
                      secrets: Iterable[str] = ()) -> None:
    """``secrets``: the values no line may show (``Settings.secret_values()``)."""
    global _secrets
    # Longest first: a secret that contains another is masked whole. Each also as JSON
    # writes it inside a string (a quote or a backslash escaped), as a list or a mapping
    # of a line is searched.
    kept = {s for s in secrets if len(s) >= 4}
    _secrets = tuple(sorted(kept | {_dumps(s)[1:-1] for s in kept}, key=len, reverse=True))
    # orjson renders a log line several times faster than json.dumps: with a line per
    # decision, that is a measurable share of the worker's time.
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _mask_card_numbers,
            _mask_secret_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class RateLimitedLog:
    """At most one line per kind per ``interval`` seconds; the next one says how many were
    left out meanwhile (``repeated``). For errors a library repeats many times a second
    while a dependency is away: the first says so at once, the rest once per interval."""

    def __init__(self, logger: Any, interval: float) -> None:
        self._log = logger
        self._interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def emit(self, kind: str, event: str, level: str = "warning", **fields: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            repeated = self._suppressed.pop(kind, 0)
        if repeated:
            fields["repeated"] = repeated
        getattr(self._log, level)(event, **fields)


class _LibrdkafkaHandler(logging.Handler):
    """librdkafka's log lines (``"%s [%s] %s"``: facility, client, text) as the service's
    own ``kafka_client_log`` lines, one per facility and level per interval."""

    def __init__(self, interval: float) -> None:
        super().__init__(logging.DEBUG)
        self._lines = RateLimitedLog(structlog.get_logger("librdkafka"), interval)

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        facility, text = (str(args[0]), str(args[2])) if len(args) == 3 else ("", record.msg)
        level = "error" if record.levelno >= logging.ERROR else (
            "warning" if record.levelno >= logging.WARNING else "info")
        self._lines.emit(f"{facility}:{level}", "kafka_client_log", level=level,
                         facility=facility, text=mask_secrets(redact(str(text)))[:500])


def librdkafka_logger(interval: float = 30.0, level: int = logging.INFO) -> logging.Logger:
    """The logger to give librdkafka (its ``logger`` setting), shared by every client with
    the same ``level`` (the dev tools' own clients pass ERROR: a retry they recover from is
    not news for whoever watches a demo)."""
    logger = logging.getLogger(f"payauth.librdkafka.{logging.getLevelName(level).lower()}")
    if not logger.handlers:
        logger.addHandler(_LibrdkafkaHandler(interval))
        logger.propagate = False
        logger.setLevel(level)
    return logger
