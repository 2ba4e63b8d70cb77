"""What can go wrong, by what to do next.

- ``InvalidMessage``: permanent, the message goes to the dead-letter topic with its reason.
- ``TransientError``: an infrastructure fault; retry with backoff, never store it as a result.
A decline is neither: it is a value (``decision.Decision``).
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
    # The worker failed on this message again and again while its dependencies answered:
    # a bug or an input nobody foresaw. Dead-lettered so that the partition moves on.
    PROCESSING_FAILED = "PROCESSING_FAILED"


class InvalidMessage(Exception):
    """The message can never be processed as sent. ``detail`` never quotes card data."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TransientError(Exception):
    """A dependency failed in a way that may pass; the work is retried, nothing is stored."""


class StoreUnavailable(TransientError):
    """PostgreSQL cannot be reached or refused the work for a reason that may pass."""


class PublishFailed(TransientError):
    """A result or dead-letter record was not acknowledged by Kafka. ``too_large``: Kafka
    refused a record for its size, which the same record would meet again (the caller
    shrinks what it sends before retrying)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large
