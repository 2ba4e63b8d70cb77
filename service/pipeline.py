"""A batch (one or more partitions, offset order within each), through the commit order.
This is the exactly-once argument.

``BatchProcessor.process(messages)``:

1. Read each message's key fields cheaply (``redelivery_key``).
2. Redis fast path, one round trip: a transaction whose stored fingerprint matches is a
   duplicate already decided, committed and published; skip it. The rest (a different
   fingerprint, a miss, Redis down) is parsed strictly and validated (exact Decimals;
   invalid → dead-letter) and goes to step 3.
3. PostgreSQL: read the dedup records of the rest (duplicates and conflicts), then decide the
   new ones in one transaction (claim, lock accounts, decide, debit/credit, ledger, dedup
   record) and COMMIT. Another replica claiming first → ``ClaimLost`` → back to step 3.
4. Publish every result event (new decisions, and stored results never confirmed published)
   and every dead-letter record; wait until Kafka acknowledges them all.
5. Report the batch finished: the consumer thread may now store its offsets for commit.
6. Hand the published transactions to the ``Confirmations`` flusher, which records their
   publication in PostgreSQL (a receipt per deciding batch) and only then writes them to the
   Redis fast path, for many batches at once. Both are optimizations that may be lost (a
   crash, Redis down): the cost is a harmless republication of the same event_id, never a
   loss, because neither is written before the COMMIT and the acknowledgement it records.

A crash or error anywhere repeats the batch from step 1 (here, or at the next owner after a
replay): every step is safe to repeat. Transient failures are retried here with backoff, so
the batch's partitions make no progress and commit nothing until the dependency is back.
Any other failure is isolated to the one message that causes it, which is dead-lettered
(``process``): no message can stop its partition.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol
from uuid import UUID

import structlog

from service import metrics
from service.adapters.kafka import Record
from service.adapters.postgres import ClaimLost, DataRejected
from service.dead_letter import SourceMessage, dead_letter_payload
from service.domain.decision import Kind, Outcome, Result, StoredResult, classify
from service.domain.errors import (
    DeadLetterReason,
    InvalidMessage,
    PublishFailed,
    StoreUnavailable,
    TransientError,
)
from service.domain.events import encode_event, result_event
from service.domain.messages import (
    DEFAULT_MAX_REFUND,
    Authorization,
    decode_authorization,
    redelivery_key,
)
from service.domain.pan import redact
from service.faults import FaultInjector

log = structlog.get_logger(__name__)

# The dead-letter topic's record limit when nothing better is known: librdkafka's default
# message.max.bytes. The worker passes what it read from the producer and the topic.
DEFAULT_DEAD_LETTER_BYTES = 1_000_000
MIN_DEAD_LETTER_BYTES = 16_384


class Message(SourceMessage, Protocol):
    def value(self) -> bytes | None: ...
    def key(self) -> bytes | None: ...


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
    ) -> list[StoredResult]: ...
    async def mark_published(self, batch_ids: Sequence[UUID],
                             txn_ids: Sequence[str]) -> None: ...


class Cache(Protocol):
    @property
    def up(self) -> bool: ...
    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]: ...
    async def set_many(self, fingerprints: dict[str, str]) -> bool: ...


class Sender(Protocol):
    async def publish(self, records: Sequence[Record]) -> None: ...


@dataclass
class _Plan:
    """What to do with each message of the batch, filled in by the steps."""

    # (message, outcome, layer or dead-letter reason, transaction_id, message_id); the ids
    # only once validated (a matching fingerprint validates the transaction_id), so that no
    # card data can ever reach a log line through them
    outcomes: list[tuple[Message, Outcome, str | None, str | None, str | None]] = field(
        default_factory=list
    )
    events: dict[str, tuple[StoredResult, bool]] = field(default_factory=dict)  # id → (, repeat)
    dead_letters: list[tuple[Message, DeadLetterReason, str]] = field(default_factory=list)
    cache: dict[str, str] = field(default_factory=dict)  # txn_id → fingerprint, after publish


@dataclass(frozen=True)
class Topics:
    output: str
    dlq: str


class BatchProcessor:
    def __init__(
        self,
        store: Store,
        cache: Cache,
        sender: Sender,
        topics: Topics,
        *,
        faults: FaultInjector | None = None,
        max_message_bytes: int = 65_536,
        max_refund: Decimal = DEFAULT_MAX_REFUND,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_BYTES,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        poison_attempts: int = 3,
        unsafe_redis_before_commit: bool = False,
    ) -> None:
        self._store = store
        self._cache = cache
        self._sender = sender
        self._topics = topics
        self._faults = faults or FaultInjector("")
        self._max_bytes = max_message_bytes
        self._max_refund = max_refund
        self._dead_letter_limit = dead_letter_max_bytes
        self._poison_attempts = poison_attempts
        # (topic, partition, offset) → why: messages that failed every attempt, to be
        # dead-lettered by the next run of their (one-message) batch.
        self._condemned: dict[tuple[str | None, int | None, int | None], str] = {}
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._unsafe_redis_before_commit = unsafe_redis_before_commit
        self.confirmations = Confirmations(store, cache, self._faults)
        self.store_ok = True

    async def process(self, msgs: Sequence[Message]) -> None:
        """Process a batch until it is done. No message can stop its partition:

        - a transient failure (PostgreSQL down, a lost claim, Kafka not acknowledging) is
          retried with backoff; the partitions wait and nothing is committed;
        - any other failure is isolated: the batch is split in halves, each processed on
          its own, down to the one message that fails; that message is tried again
          ``poison_attempts`` times and, if it still fails while PostgreSQL answers, it is
          dead-lettered (``PROCESSING_FAILED``, the error's type in the detail) and the
          partition moves on.
        """
        started = time.perf_counter()
        await self._process(msgs)
        metrics.processing_seconds.observe(time.perf_counter() - started)

    async def _process(self, msgs: Sequence[Message]) -> None:
        attempt = 0
        failures = 0
        try:
            while True:
                try:
                    plan = await self._run_once(msgs)
                    break
                except TransientError as exc:
                    attempt += 1
                    cause = _cause(exc)
                    if isinstance(exc, StoreUnavailable):
                        self.store_ok = False
                    if isinstance(exc, PublishFailed) and exc.too_large:
                        self._shrink_dead_letter_limit()
                    await self._back_off(msgs, attempt, cause, exc)
                except Exception as exc:  # not transient: a bug, or an input nobody foresaw
                    if len(msgs) > 1:
                        await self._isolate(msgs, exc)
                        return
                    failures += 1
                    if failures < self._poison_attempts or not await self._store.ping():
                        attempt += 1
                        await self._back_off(msgs, attempt, "unexpected", exc)
                        continue
                    self._condemned[_coordinates(msgs[0])] = _failure_detail(exc)
        finally:
            if len(msgs) == 1:
                self._condemned.pop(_coordinates(msgs[0]), None)
        self.store_ok = True
        self._account(plan)

    async def _isolate(self, msgs: Sequence[Message], exc: Exception) -> None:
        """Split a batch that failed for no transient reason; each half goes on alone, in
        order (a partition's messages keep their order: the halves run one after the other)."""
        metrics.retries_total.labels("isolate").inc()
        log.error("batch_failed_isolating", messages=len(msgs), error=_failure_detail(exc),
                  partitions=sorted({m.partition() for m in msgs}, key=lambda p: p or 0),
                  first_offset=msgs[0].offset())
        half = len(msgs) // 2
        await self._process(msgs[:half])
        await self._process(msgs[half:])

    async def _back_off(self, msgs: Sequence[Message], attempt: int, cause: str,
                        exc: Exception) -> None:
        metrics.retries_total.labels(cause).inc()
        delay = min(self._backoff_max, self._backoff_initial * 2 ** min(attempt, 20))
        delay *= random.uniform(0.5, 1.0)  # jitter: replicas do not retry in step
        log.warning(
            "batch_retry", cause=cause, attempt=attempt, delay_s=round(delay, 3),
            partition=msgs[0].partition(), first_offset=msgs[0].offset(),
            messages=len(msgs), error=_failure_detail(exc),
        )
        await asyncio.sleep(delay)

    def _shrink_dead_letter_limit(self) -> None:
        """Kafka refused a record as too large although it was under our limit (the topic's
        limit is lower than what we read at start): aim lower; the retry truncates more."""
        self._dead_letter_limit = max(MIN_DEAD_LETTER_BYTES, self._dead_letter_limit // 4)
        log.warning("dead_letter_limit_lowered", max_record_bytes=self._dead_letter_limit)

    # ------------------------------------------------------------------ steps
    async def _run_once(self, msgs: Sequence[Message]) -> _Plan:
        plan = _Plan()
        stage = _StageClock()
        # 1. read each message's key fields, cheaply (None: the full path decides)
        if self._condemned:
            condemned = [self._condemned.get(_coordinates(msg)) for msg in msgs]
            if any(condemned):
                return await self._dead_letter_condemned(msgs, condemned)
        keys = [redelivery_key(msg.value(), max_bytes=self._max_bytes) for msg in msgs]
        stage.lap("parse")

        # 2. Redis fast path, before the strict parse and the schema check: a redelivery
        # whose key fields are exactly those of a decided transaction needs nothing more (a
        # replay of millions skips the costliest steps); anything else is parsed, validated
        # and goes on to PostgreSQL.
        started = time.perf_counter()
        known = await self._cache.get_many([key[0] for key in keys if key is not None])
        metrics.dedup_lookup_seconds.labels("redis").observe(time.perf_counter() - started)
        metrics.redis_up.set(1 if self._cache.up else 0)
        stage.lap("redis")
        to_store: list[tuple[Message, Authorization]] = []
        for msg, key in zip(msgs, keys, strict=True):
            if key is not None and known.get(key[0]) == key[1]:
                plan.outcomes.append((msg, Outcome.DUPLICATE, "redis", key[0], None))
                continue
            try:
                to_store.append((msg, decode_authorization(
                    msg.value(), max_bytes=self._max_bytes, max_refund=self._max_refund)))
            except InvalidMessage as exc:
                self._invalid(plan, msg, exc)
            except Exception as exc:  # decoding is pure: trying again would fail the same way
                self._invalid(plan, msg, InvalidMessage(
                    DeadLetterReason.PROCESSING_FAILED, f"decoding failed: {_failure_detail(exc)}"))
        stage.lap("validate")

        # 3. PostgreSQL
        if to_store:
            await self._decide(to_store, plan, stage)

        # 4. publish results and dead letters; wait for every acknowledgement
        await self._publish(plan)
        stage.lap("publish")
        metrics.batch_messages.observe(len(msgs))
        self._faults.reach("after_publish")

        # 6. (off the critical path) confirm publication, then the Redis fast path
        self.confirmations.add(plan.events.values(), plan.cache)
        return plan

    async def _dead_letter_condemned(self, msgs: Sequence[Message],
                                     condemned: list[str | None]) -> _Plan:
        """The message that kept failing (``process``): to the dead-letter topic, alone."""
        plan = _Plan()
        for msg, detail in zip(msgs, condemned, strict=True):
            assert detail is not None, "a condemned message is always processed alone"
            self._invalid(plan, msg, InvalidMessage(DeadLetterReason.PROCESSING_FAILED,
                                                    detail))
        await self._publish(plan)
        return plan

    @staticmethod
    def _invalid(plan: _Plan, msg: Message, exc: InvalidMessage) -> None:
        plan.dead_letters.append((msg, exc.reason, exc.detail))
        plan.outcomes.append((msg, Outcome.INVALID, exc.reason.value, None, None))

    async def _decide(self, items: list[tuple[Message, Authorization]], plan: _Plan,
                      stage: _StageClock) -> None:
        auths = [a for _, a in items]
        started = time.perf_counter()
        stored = await self._store.load_stored(list({a.transaction_id for a in auths}))
        metrics.dedup_lookup_seconds.labels("postgres").observe(time.perf_counter() - started)
        stage.lap("postgres_lookup")
        classified = classify(auths, stored)
        new_items = [(m, c.auth) for (m, _), c in zip(items, classified, strict=True)
                     if c.kind is Kind.NEW]
        decided = await self._authorize(new_items, plan)
        stage.lap("postgres_commit")
        first_results = {r.transaction_id: r for r in decided}

        for (msg, auth), c in zip(items, classified, strict=True):
            if c.kind is Kind.NEW:
                record = first_results.get(auth.transaction_id)
                if record is None:
                    continue  # dead-lettered by _authorize
                outcome = Outcome.APPROVED if record.result is Result.APPROVED else Outcome.DECLINED
                plan.outcomes.append((msg, outcome, None, auth.transaction_id, auth.message_id))
                plan.events[auth.transaction_id] = (record, False)
                plan.cache[auth.transaction_id] = auth.fingerprint
            elif c.kind is Kind.DUPLICATE:
                plan.outcomes.append((msg, Outcome.DUPLICATE, "postgres", auth.transaction_id,
                                      auth.message_id))
                if c.previous is not None:
                    if not c.previous.published:
                        # Decided earlier but its event was never confirmed: publish it again.
                        plan.events.setdefault(auth.transaction_id, (c.previous, True))
                    plan.cache[auth.transaction_id] = auth.fingerprint
            else:
                plan.outcomes.append((msg, Outcome.CONFLICT, None, auth.transaction_id,
                                      auth.message_id))
                plan.dead_letters.append(
                    (msg, DeadLetterReason.IDEMPOTENCY_KEY_CONFLICT,
                     "transaction_id already seen with a different amount, currency, account "
                     "or type; nothing was debited")
                )

    async def _authorize(
        self, items: list[tuple[Message, Authorization]], plan: _Plan
    ) -> list[StoredResult]:
        """Commit the new ones; if PostgreSQL rejects the data itself, find the message(s)
        responsible one by one and dead-letter them, so one bad row cannot block the rest."""
        if not items:
            return []
        try:
            records = await self._commit(items)
        except DataRejected as exc:
            if len(items) == 1:
                msg = items[0][0]
                plan.dead_letters.append((msg, DeadLetterReason.SCHEMA_VIOLATION,
                                          f"rejected by the database: {str(exc)[:200]}"))
                plan.outcomes.append((msg, Outcome.INVALID, "database", None, None))
                return []
            records = []
            for item in items:
                records.extend(await self._authorize([item], plan))
        return records

    async def _commit(self, items: list[tuple[Message, Authorization]]) -> list[StoredResult]:
        if self._unsafe_redis_before_commit:
            # The WRONG order, for the checker's negative control only (see Settings).
            await self._cache.set_many({a.transaction_id: a.fingerprint for _, a in items})
        self._faults.reach("before_db_commit")
        first = items[0][0]
        records = await self._store.authorize(
            [a for _, a in items],
            source_topic=first.topic() or "",
            source_partitions=[m.partition() or 0 for m, _ in items],
            source_offsets=[m.offset() or 0 for m, _ in items],
        )
        self._faults.reach("after_db_commit")
        return records

    async def _publish(self, plan: _Plan) -> None:
        records = [
            Record(self._topics.output, record.account_id,
                   encode_event(result_event(record)))
            for record, _repeat in plan.events.values()
        ]
        for msg, reason, detail in plan.dead_letters:
            key, value, headers = dead_letter_payload(
                msg, msg.key(), msg.value(), reason, detail,
                max_record_bytes=self._dead_letter_limit)
            records.append(Record(self._topics.dlq, key, value, headers))
        await self._sender.publish(records)
        for _record, repeat in plan.events.values():
            metrics.events_published_total.labels("republish" if repeat else "first").inc()

    # ------------------------------------------------------------- accounting
    def _account(self, plan: _Plan) -> None:
        """Metrics once per batch; one log line per batch for its decisions (partition,
        offset, transaction_id, outcome each: the audit trail, searchable by id, at a fraction
        of the cost of a line each), one per problem; duplicates are summed up in one warning
        per batch, ids included, so that a replay of millions does not flood the logs."""
        outcomes: Counter[str] = Counter()
        layers: Counter[str] = Counter()
        duplicate_ids: list[str] = []
        decided: list[tuple[int | None, int | None, str | None, str]] = []
        debug = log.is_enabled_for(logging.DEBUG)
        for msg, outcome, detail, txn_id, message_id in plan.outcomes:
            outcomes[outcome.value] += 1
            if outcome is Outcome.DUPLICATE:  # the common case of a replay: kept cheap
                layers[detail or "postgres"] += 1
                if txn_id is not None:
                    duplicate_ids.append(txn_id)
                if debug:
                    log.debug("duplicate", layer=detail, partition=msg.partition(),
                              offset=msg.offset(), transaction_id=txn_id)
            elif outcome is Outcome.APPROVED or outcome is Outcome.DECLINED:
                decided.append((msg.partition(), msg.offset(), txn_id, outcome.value))
            else:
                fields: dict[str, object] = {
                    "partition": msg.partition(), "offset": msg.offset(),
                    "outcome": outcome.value, "transaction_id": txn_id,
                    "message_id": message_id,
                }
                if outcome is Outcome.INVALID:
                    log.warning("dead_lettered", reason=detail, **fields)
                else:
                    log.warning("idempotency_key_conflict", **fields)
        if decided:
            log.info("decided", count=len(decided),
                     decisions=[{"partition": p, "offset": o, "transaction_id": t,
                                 "outcome": r} for p, o, t, r in decided])
        for name, count in outcomes.items():
            metrics.messages_total.labels(name).inc(count)
        for layer, count in layers.items():
            metrics.duplicates_total.labels(layer).inc(count)
        if duplicate_ids:
            first = plan.outcomes[0][0]
            log.warning(
                "duplicates", count=len(duplicate_ids), by_layer=dict(layers),
                partition=first.partition(), transaction_ids=duplicate_ids[:100],
                more=max(0, len(duplicate_ids) - 100),
            )
        reasons = Counter(reason.value for _msg, reason, _detail in plan.dead_letters)
        for reason, count in reasons.items():
            metrics.dead_letters_total.labels(reason).inc(count)


class Confirmations:
    """Records publication in PostgreSQL (a receipt per batch that decided transactions, or
    published_at for a republished record), then remembers the transactions in Redis, many
    batches at a time (one statement and one Redis round trip per flush)."""

    def __init__(self, store: Store, cache: Cache, faults: FaultInjector) -> None:
        self._store = store
        self._cache = cache
        self._faults = faults
        self._receipts: set[UUID] = set()
        self._republished: list[str] = []
        self._fingerprints: dict[str, str] = {}
        self._wakeup = asyncio.Event()

    def add(self, published: Iterable[tuple[StoredResult, bool]],
            fingerprints: dict[str, str]) -> None:
        """``published``: each event acknowledged, with whether it was a republication."""
        for record, repeat in published:
            if record.batch_id is not None and not repeat:
                self._receipts.add(record.batch_id)
            else:
                self._republished.append(record.transaction_id)
        self._fingerprints.update(fingerprints)
        if self._receipts or self._republished or self._fingerprints:
            self._wakeup.set()

    async def flush(self) -> None:
        receipts, self._receipts = self._receipts, set()
        republished, self._republished = self._republished, []
        fingerprints, self._fingerprints = self._fingerprints, {}
        if receipts or republished:
            try:
                await self._store.mark_published(sorted(receipts), republished)
            except (TransientError, DataRejected) as exc:
                # Harmless: a later duplicate republishes the same event_id once more.
                log.warning("mark_published_failed", error=str(exc)[:300])
        if fingerprints:
            await self._cache.set_many(fingerprints)
            metrics.redis_up.set(1 if self._cache.up else 0)
            self._faults.reach("after_redis_set")

    async def run(self, interval: float = 0.05) -> None:
        """Flush whenever there is something, at most every ``interval`` seconds."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.flush()
            await asyncio.sleep(interval)


class _StageClock:
    """Observes the time since the previous lap under the stage just finished."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        metrics.stage_seconds.labels(stage).observe(now - self._last)
        self._last = now


def _coordinates(msg: Message) -> tuple[str | None, int | None, int | None]:
    return msg.topic(), msg.partition(), msg.offset()


def _failure_detail(exc: BaseException) -> str:
    """The error's type and first words, masked: an error text may quote its input."""
    return redact(f"{type(exc).__name__}: {exc}")[:300]


def _cause(exc: TransientError) -> str:
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable"
    if isinstance(exc, ClaimLost):
        return "claim_lost"
    if isinstance(exc, PublishFailed):
        return "publish_failed"
    return "transient"
