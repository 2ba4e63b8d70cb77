"""Dead-letter records: the original bytes, unchanged, and headers saying why and from where.

A record the dead-letter topic cannot take whole (the original is larger than the
producer's ``message.max.bytes`` or the topic's ``max.message.bytes``) is still written,
so that the partition moves on and nothing is lost from sight: its value is the first
``PREVIEW_BYTES`` of the original, and headers give the original's size and SHA-256
(``original.size``, ``original.sha256``, ``original.truncated``). The original itself stays
on the input topic at ``source.partition``/``source.offset`` (for the topic's retention),
where ``payauth dlq redrive`` fetches it, checking the hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from service.core.ports import Message
from service.domain.errors import DeadLetterReason
from service.domain.pan import redact

PREVIEW_BYTES = 1024
# Room for the record's own framing (batch and record headers, timestamps) beside key,
# value and headers, so that an estimate under the limit is under it on the wire too.
RECORD_OVERHEAD_BYTES = 512


def dead_letter_headers(
    msg: Message, reason: DeadLetterReason | str, detail: str
) -> list[tuple[str, bytes]]:
    _, timestamp_ms = msg.timestamp()
    headers = [
        ("error.reason", str(reason).encode()),
        # Built from safe parts already; masked once more here, the last door out.
        ("error.detail", redact(detail)[:1000].encode()),
        ("source.topic", (msg.topic() or "").encode()),
        ("source.partition", str(msg.partition()).encode()),
        ("source.offset", str(msg.offset()).encode()),
        ("source.timestamp", str(timestamp_ms).encode()),
    ]
    # Keep the producer's own headers (e.g. a redrive marker) after ours.
    own = ("error.", "source.", "original.", "conflict.")
    headers.extend((k, v) for k, v in (msg.headers() or []) if not k.startswith(own))
    return headers


def dead_letter_payload(
    msg: Message, key: bytes | None, value: bytes | None, reason: DeadLetterReason | str,
    detail: str, *, max_record_bytes: int,
    extra_headers: Sequence[tuple[str, bytes]] = (),
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """(key, value, headers) of the dead-letter record for ``msg``: the original bytes when
    the record fits in ``max_record_bytes``, else a preview with the original's size and
    hash (and the key's first bytes, should the key be what is too large)."""
    headers = dead_letter_headers(msg, reason, detail)
    # After our six, before the producer's own (the truncation below keeps the first six).
    headers[6:6] = [(k, redact(v.decode(errors="replace"))[:500].encode())
                    for k, v in extra_headers]
    size = (len(value or b"") + len(key or b"") + RECORD_OVERHEAD_BYTES
            + sum(len(k) + len(v) for k, v in headers))
    if size <= max_record_bytes:
        return key, value, headers
    value = value or b""
    ours, theirs = headers[:6 + len(extra_headers)], headers[6 + len(extra_headers):]
    ours[1:1] = [
        ("original.truncated", b"true"),
        ("original.size", str(len(value)).encode()),
        ("original.sha256", hashlib.sha256(value).hexdigest().encode()),
    ]
    preview, key = value[:PREVIEW_BYTES], key[:PREVIEW_BYTES] if key else key
    size = (len(preview) + len(key or b"") + RECORD_OVERHEAD_BYTES
            + sum(len(k) + len(v) for k, v in ours + theirs))
    if size > max_record_bytes:  # the producer's own headers are what is too large
        theirs = [("original.headers_dropped", str(len(theirs)).encode())]
    return key, preview, ours + theirs
