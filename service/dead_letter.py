"""Dead-letter records: the original bytes, unchanged, and headers saying why and from where."""

from __future__ import annotations

from typing import Protocol

from service.domain.errors import DeadLetterReason


class SourceMessage(Protocol):
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...


def dead_letter_headers(
    msg: SourceMessage, reason: DeadLetterReason | str, detail: str
) -> list[tuple[str, bytes]]:
    _, timestamp_ms = msg.timestamp()
    headers = [
        ("error.reason", str(reason).encode()),
        ("error.detail", detail[:1000].encode()),
        ("source.topic", (msg.topic() or "").encode()),
        ("source.partition", str(msg.partition()).encode()),
        ("source.offset", str(msg.offset()).encode()),
        ("source.timestamp", str(timestamp_ms).encode()),
    ]
    # Keep the producer's own headers (e.g. a redrive marker) after ours.
    own = ("error.", "source.")
    headers.extend((k, v) for k, v in (msg.headers() or []) if not k.startswith(own))
    return headers
