"""What can be wrong with a message: ``InvalidMessage`` is permanent, the message goes to the
dead-letter topic with its ``DeadLetterReason``.

A decline is not an error: it is a value, a result stored like an approval. The
infrastructure errors (retry with backoff, never store as a result) live with the ports the
adapters translate them to: ``service/core/ports.py``.
"""

from __future__ import annotations

from enum import StrEnum


class DeadLetterReason(StrEnum):
    INVALID_ENCODING = "INVALID_ENCODING"
    INVALID_JSON = "INVALID_JSON"
    SCHEMA_VIOLATION = "SCHEMA_VIOLATION"
    TOO_LARGE = "TOO_LARGE"
    CARD_DATA_PRESENT = "CARD_DATA_PRESENT"
    IDEMPOTENCY_KEY_CONFLICT = "IDEMPOTENCY_KEY_CONFLICT"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"  # a REFUND above PAYAUTH_MAX_REFUND_AMOUNT
    # A REVERSAL/CLEARING whose original is of another account or currency, or a REFUND,
    # REVERSAL or CLEARING (a CLEARING of a PURCHASE too): nothing changed.
    LIFECYCLE_MISMATCH = "LIFECYCLE_MISMATCH"
    # The worker failed on this message again and again while its dependencies answered:
    # a bug or an input nobody foresaw. Dead-lettered so that the partition moves on.
    PROCESSING_FAILED = "PROCESSING_FAILED"


class InvalidMessage(Exception):
    """The message can never be processed as sent. ``detail`` never quotes card data."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
