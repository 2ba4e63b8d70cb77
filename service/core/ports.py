"""The ports: what the batch runner needs from the outside world, defined here and implemented
by the adapters (``service/adapters``). The core (``plan``, ``pipeline``, ``dispatcher``)
imports these, never an adapter; an adapter translates its library's exceptions into the
errors below at its boundary. This is the one home of the infrastructure errors, grouped by
what to do next: ``TransientError`` and its kinds are retried with backoff and never stored
as a result; ``DataRejected`` isolates the message responsible and dead-letters it.

- ``Store``: the dedup records and the authorize call (PostgreSQL).
- ``Cache``: the fast path (Redis); may only ever give false negatives.
- ``Publisher``: result events and dead letters, returning once Kafka acknowledged them all.
- ``OffsetSink``: where finished work is reported, for the consumer to store its offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from service.domain.dedup import StoredResult
from service.domain.messages import Authorization
from service.domain.vocabulary import DuplicateCause, DuplicateLayer

TP = tuple[str, int]  # (topic, partition)
# A batch's duplicates of one cause, layer and partition: (cause, layer, partition, txn ids)
Sighting = tuple[DuplicateCause, DuplicateLayer, int, list[str]]


class Message(Protocol):
    """A consumed record, as the core reads it (confluent-kafka's ``Message`` is one)."""

    def value(self) -> bytes | None: ...
    def key(self) -> bytes | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...


@dataclass(slots=True)  # not frozen: built once per event, and frozen init costs 3x
class Record:
    """A record to publish."""

    topic: str
    key: bytes | str | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class TransientError(Exception):
    """A dependency failed in a way that may pass; the work is retried, nothing is stored."""


class StoreUnavailable(TransientError):
    """PostgreSQL cannot be reached or refused the work for a reason that may pass."""


class StoreRefused(StoreUnavailable):
    """PostgreSQL refused the worker itself: a bad password, no TLS or no ``pg_hba`` line for
    it, an untrusted server certificate, a missing grant. Retried like an outage, but
    reported as a refusal (``/readyz`` names it): waiting will not cure it."""


class PublishFailed(TransientError):
    """A result or dead-letter record was not acknowledged by Kafka. ``too_large``: Kafka
    refused a record for its size, which the same record would meet again (the caller
    shrinks what it sends before retrying)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class ClaimLost(TransientError):
    """Another replica claimed a transaction of this batch first, and the store could not
    answer that one alone (nothing of the batch written); retry the batch."""


class StatementTimedOut(TransientError):
    """The batch's statement ran past its timeout and was rolled back. Retried whole it may
    time out again for ever: the batch is decided in smaller parts instead."""


class DataRejected(Exception):
    """The store refused the data itself (a constraint the validation did not foresee).

    Not transient: retrying the same batch fails the same way. The caller isolates the
    message(s) responsible and dead-letters them."""


class Refusals(Protocol):
    """Where an adapter reports that its engine refuses the worker (``/readyz`` names it)
    and that it accepts it again; ``source`` names the connection (``"redis"``...)."""

    def refused(self, source: str, reason: str) -> None: ...
    def accepted(self, source: str) -> None: ...


class Store(Protocol):
    async def ping(self) -> bool: ...
    async def load_stored(self, txn_ids: Sequence[str]) -> dict[str, StoredResult]: ...
    async def authorize(
        self,
        new: Sequence[Authorization],
        *,
        source_topic: str,
        source_partitions: Sequence[int],
        source_offsets: Sequence[int],
    ) -> list[StoredResult]:
        """The records of those decided and committed; one another replica decided first
        while this call waited for it has none (``ClaimLost``: nothing of this call
        committed)."""
        ...
    async def mark_published(self, batch_ids: Sequence[UUID],
                             txn_ids: Sequence[str]) -> None: ...
    async def record_sightings(self, sightings: Sequence[Sighting]) -> None: ...
    async def replay_marks(self, group_id: str, topic: str) -> dict[int, int]: ...


class Cache(Protocol):
    @property
    def up(self) -> bool: ...
    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]: ...
    async def set_many(self, fingerprints: dict[str, str]) -> bool: ...


class Publisher(Protocol):
    async def publish(self, records: Sequence[Record]) -> None: ...


class OffsetSink(Protocol):
    def done(self, tp: TP, next_offset: int, count: int) -> None: ...
