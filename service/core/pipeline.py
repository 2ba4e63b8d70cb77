"""The commit order: a batch (one or more partitions, offset order within each), from its
messages to its stored offsets. This is the exactly-once argument, written once; the other
modules point here.

``BatchProcessor.process(messages)``:

1. Read each message's key fields cheaply (``plan.read_keys``).
2. Fast path (``Cache``), one round trip: a transaction whose stored fingerprint matches is
   a duplicate already decided, committed and published; skip it. The rest (a different
   fingerprint, a miss, the cache down) is parsed strictly and validated (exact Decimals;
   invalid → dead-letter) and goes to step 3.
3. ``Store``: read the dedup records of the rest (duplicates and conflicts; only decisions
   already on the synchronous standby come back, see ``PostgresStore.load_stored``), then
   decide the new ones in one transaction (claim, lock accounts, decide, debit/credit,
   ledger, dedup record) and COMMIT. A transaction another replica decided first while the
   batch waited for it is left out of that commit and looked up again (a duplicate, or a
   conflict): a lost claim costs its own message, not the batch. ``ClaimLost`` (a claim
   the store could not name) → back to step 1.
4. Publish every result event (new decisions, and stored results never confirmed published)
   and every dead-letter record (``Publisher``); wait until Kafka acknowledges them all.
5. Report the batch's offsets finished (``OffsetSink``): only now may the consumer thread
   store them for commit (``adapters/kafka/consumer.py`` commits what was stored, every
   ``PAYAUTH_COMMIT_INTERVAL_MS`` and synchronously on revoke and stop).
6. Hand the published transactions to ``Confirmations``, which records their publication
   in the store (a receipt per deciding batch) and only then writes them to the fast path,
   for many batches at once. Both are optimizations that may be lost (a crash, the cache
   down): the cost is a harmless republication of the same event_id, never a loss, because
   neither is written before the COMMIT and the acknowledgement it records.

A crash or error anywhere repeats the batch from step 1 (here, or at the next owner after a
replay): every step is safe to repeat. Transient failures are retried here with backoff, so
the batch's partitions make no progress and commit nothing until the dependency is back.
Any other failure is isolated to the one message that causes it, which is dead-lettered
(``process``): no message can stop its partition.

What each message becomes is decided by the pure functions of ``plan``; metrics and log
lines come from ``accounting``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from service import metrics
from service.core.confirmations import Confirmations
from service.core.dead_letter import dead_letter_payload
from service.core.plan import (
    BatchPlan,
    Conflict,
    Invalid,
    Limits,
    MessageOutcome,
    decided,
    decode_all,
    failure_detail,
    in_message_order,
    read_keys,
    split_fast_path,
    split_stored,
)
from service.core.ports import (
    TP,
    Cache,
    ClaimLost,
    DataRejected,
    Message,
    OffsetSink,
    Publisher,
    PublishFailed,
    Record,
    StatementTimedOut,
    Store,
    StoreUnavailable,
    TransientError,
)
from service.core.reporting import StageClock, account
from service.core.store_absence import until_store_answers
from service.domain.dedup import StoredResult
from service.domain.errors import DeadLetterReason
from service.domain.events import encode_event, events_of
from service.domain.messages import Authorization

log = structlog.get_logger(__name__)

# The dead-letter topic's record limit when nothing better is known: librdkafka's default
# message.max.bytes. The worker passes what it read from the producer and the topic.
DEFAULT_DEAD_LETTER_BYTES = 1_000_000
MIN_DEAD_LETTER_BYTES = 16_384
# A batch's lookups before it is retried whole (``_decide``): the second finds every claim
# the first decision lost; a third is slack for a claim lost again in between.
_LOOKUPS_PER_BATCH = 3


@dataclass(frozen=True)
class Topics:
    output: str
    dlq: str


class BatchProcessor:
    def __init__(
        self,
        store: Store,
        cache: Cache,
        publisher: Publisher,
        offsets: OffsetSink,
        topics: Topics,
        *,
        limits: Limits | None = None,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_BYTES,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        poison_attempts: int = 3,
    ) -> None:
        self._store = store
        self._cache = cache
        self._publisher = publisher
        self._offsets = offsets
        self._topics = topics
        self._limits = limits or Limits()
        self._dead_letter_limit = dead_letter_max_bytes
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._poison_attempts = poison_attempts
        # (topic, partition, offset) → why: messages that failed every attempt, to be
        # dead-lettered by the next run of their (one-message) batch.
        self._condemned: dict[tuple[str | None, int | None, int | None], str] = {}
        self.confirmations = Confirmations(store, cache)
        self.store_ok = True
        # partition → the offset an operator's replay rewound from (``refresh_replay_marks``)
        self.replay_marks: dict[int, int] = {}

    async def refresh_replay_marks(self, group_id: str, topic: str) -> None:
        """Read the replay marks (a duplicate below one is cause ``replay``); kept as they
        were when the store does not answer: they only label metrics."""
        try:
            self.replay_marks = await self._store.replay_marks(group_id, topic)
        except (TransientError, DataRejected) as exc:
            log.warning("replay_marks_unreadable", error=str(exc)[:300])

    async def process(self, msgs: Sequence[Message]) -> None:
        """Process a batch until it is done. No message can stop its partition:

        - a transient failure (PostgreSQL down, a lost claim, Kafka not acknowledging) is
          retried with backoff (PostgreSQL away: until it answers again, at most that); the
          partitions wait and nothing is committed;
        - a batch whose statement ran past its timeout is split in halves, decided one after
          the other (a partition's messages keep their order), each split again if it too
          times out: the batch is not retried whole, which could time out for ever while
          its partitions wait (a lone message that times out is retried with backoff);
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
                except StatementTimedOut as exc:
                    if len(msgs) > 1:
                        await self._split(msgs, exc, "statement_timeout")
                        return
                    attempt += 1
                    await self._back_off(msgs, attempt, _cause(exc), exc)
                except TransientError as exc:
                    attempt += 1
                    if isinstance(exc, StoreUnavailable):
                        self.store_ok = False
                    if isinstance(exc, PublishFailed) and exc.too_large:
                        self._shrink_dead_letter_limit()
                    await self._back_off(msgs, attempt, _cause(exc), exc)
                except Exception as exc:  # not transient: a bug, or an input nobody foresaw
                    if len(msgs) > 1:
                        await self._split(msgs, exc, "isolate")
                        return
                    failures += 1
                    if failures < self._poison_attempts or not await self._store.ping():
                        attempt += 1
                        await self._back_off(msgs, attempt, "unexpected", exc)
                        continue
                    self._condemned[_coordinates(msgs[0])] = failure_detail(exc)
        finally:
            if len(msgs) == 1:
                self._condemned.pop(_coordinates(msgs[0]), None)
        self.store_ok = True
        account(plan)

    async def _split(self, msgs: Sequence[Message], exc: Exception, cause: str) -> None:
        """A batch that failed for no transient reason (``isolate``) or whose statement timed
        out: each half goes on alone, the first, then the second (a partition's messages keep
        their order)."""
        metrics.retries_total.labels(cause).inc()
        log.warning("batch_split", cause=cause, messages=len(msgs), error=failure_detail(exc),
                    partitions=sorted({m.partition() or 0 for m in msgs}),
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
            messages=len(msgs), error=failure_detail(exc),
        )
        if isinstance(exc, StoreUnavailable):
            await until_store_answers(self._store, delay, probe_every=self._backoff_initial)
        else:
            await asyncio.sleep(delay)

    def _shrink_dead_letter_limit(self) -> None:
        """Kafka refused a record as too large although it was under our limit (the topic's
        limit is lower than what we read at start): aim lower; the retry truncates more."""
        self._dead_letter_limit = max(MIN_DEAD_LETTER_BYTES, self._dead_letter_limit // 4)
        log.warning("dead_letter_limit_lowered", max_record_bytes=self._dead_letter_limit)

    # ------------------------------------------------------------------ steps
    async def _run_once(self, msgs: Sequence[Message]) -> BatchPlan:
        if self._condemned and any(_coordinates(m) in self._condemned for m in msgs):
            return await self._dead_letter_condemned(msgs)
        stage = StageClock()
        # 1. the key fields, cheaply
        keys = read_keys(msgs, self._limits)
        stage.lap("parse")

        # 2. fast path, before the strict parse and the schema check: a redelivery whose key
        # fields are exactly those of a decided transaction needs nothing more (a replay of
        # millions skips the costliest steps); anything else is parsed and validated.
        started = time.perf_counter()
        known = await self._cache.get_many([key[0] for key in keys if key is not None])
        metrics.dedup_lookup_seconds.labels("redis").observe(time.perf_counter() - started)
        metrics.redis_up.set(1 if self._cache.up else 0)
        stage.lap("redis")
        fast_duplicates, rest, rest_keys = split_fast_path(msgs, keys, known, self.replay_marks)
        valid, invalid = decode_all(rest, self._limits, rest_keys)
        stage.lap("validate")

        # 3. the store
        outcomes: list[MessageOutcome] = [*fast_duplicates, *invalid]
        if valid:
            outcomes += await self._decide(valid, stage)
        plan = BatchPlan(in_message_order(outcomes, msgs))

        # 4. publish results and dead letters; wait for every acknowledgement
        await self._publish(plan)
        stage.lap("publish")
        metrics.batch_messages.observe(len(msgs))

        # 5. only now may the offsets be stored and committed
        self._report_offsets(msgs)

        # 6. (off the critical path) confirm publication, then the fast path
        self.confirmations.add(plan.events, plan.fast_path_entries(), plan.sightings())
        return plan

    async def _decide(self, valid: list[tuple[Message, Authorization]],
                      stage: StageClock) -> list[MessageOutcome]:
        """Look the batch up, decide the new ones; those whose claims another replica won
        meanwhile (no record: nothing of them written) are looked up again, the store's
        decisions for the rest committed already. A lookup that finds them ends it; a
        store that keeps answering lost for keys its lookup cannot find is a fault, and
        the batch is retried whole (``ClaimLost``)."""
        outcomes: list[MessageOutcome] = []
        pending = valid
        for _ in range(_LOOKUPS_PER_BATCH):
            started = time.perf_counter()
            stored = await self._store.load_stored(list({a.transaction_id for _, a in pending}))
            metrics.dedup_lookup_seconds.labels("postgres").observe(
                time.perf_counter() - started)
            stage.lap("postgres_lookup")
            new, repeats = split_stored(pending, stored, self.replay_marks)
            refused: list[Invalid] = []
            records = {r.transaction_id: r for r in await self._authorize(new, refused)}
            stage.lap("postgres_commit")
            outcomes += [*decided(new, records), *repeats, *refused]
            answered = {id(invalid.msg) for invalid in refused}
            pending = [(msg, auth) for msg, auth in new
                       if auth.transaction_id not in records and id(msg) not in answered]
            if not pending:
                return outcomes
            metrics.retries_total.labels("claim_lost").inc()
            log.info("claims_lost", messages=len(pending), decided=len(records),
                     partition=pending[0][0].partition(), first_offset=pending[0][0].offset())
        raise ClaimLost(f"{len(pending)} claim(s) lost that a lookup could not find")

    async def _authorize(self, items: list[tuple[Message, Authorization]],
                         refused: list[Invalid]) -> list[StoredResult]:
        """Commit the new ones; if the store rejects the data itself, find the message(s)
        responsible one by one and dead-letter them, so one bad row cannot block the rest."""
        if not items:
            return []
        try:
            first = items[0][0]
            return await self._store.authorize(
                [a for _, a in items],
                source_topic=first.topic() or "",
                source_partitions=[m.partition() or 0 for m, _ in items],
                source_offsets=[m.offset() or 0 for m, _ in items],
            )
        except DataRejected as exc:
            if len(items) == 1:
                refused.append(Invalid(items[0][0], DeadLetterReason.SCHEMA_VIOLATION,
                                       f"rejected by the database: {str(exc)[:200]}",
                                       source="database"))
                return []
            records: list[StoredResult] = []
            for item in items:
                records.extend(await self._authorize([item], refused))
            return records

    async def _dead_letter_condemned(self, msgs: Sequence[Message]) -> BatchPlan:
        """The message that kept failing (``process``): to the dead-letter topic, alone."""
        plan = BatchPlan([Invalid(m, DeadLetterReason.PROCESSING_FAILED,
                                  self._condemned[_coordinates(m)], source="processing")
                          for m in msgs])
        await self._publish(plan)
        self._report_offsets(msgs)
        return plan

    async def _publish(self, plan: BatchPlan) -> None:
        events = plan.events
        records = [Record(self._topics.output, record.account_id, encode_event(event))
                   for record, _repeat in events for event in events_of(record)]
        for letter in plan.dead_letters():
            msg = letter.msg
            key, value, headers = dead_letter_payload(
                msg, msg.key(), msg.value(), letter.reason, letter.detail,
                max_record_bytes=self._dead_letter_limit,
                extra_headers=letter.headers() if isinstance(letter, Conflict) else ())
            records.append(Record(self._topics.dlq, key, value, headers))
        await self._publisher.publish(records)
        republished = sum(1 for _record, repeat in events if repeat)
        if republished:
            metrics.events_published_total.labels("republish").inc(republished)
        if len(events) > republished:
            metrics.events_published_total.labels("first").inc(len(events) - republished)

    def _report_offsets(self, msgs: Sequence[Message]) -> None:
        last: dict[TP, tuple[int, int]] = {}
        for msg in msgs:
            tp = (msg.topic() or "", msg.partition() or 0)
            _, count = last.get(tp, (0, 0))
            last[tp] = ((msg.offset() or 0) + 1, count + 1)
        for tp, (next_offset, count) in last.items():
            self._offsets.done(tp, next_offset, count)


def _coordinates(msg: Message) -> tuple[str | None, int | None, int | None]:
    return msg.topic(), msg.partition(), msg.offset()


def _cause(exc: TransientError) -> str:
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable"
    if isinstance(exc, StatementTimedOut):
        return "statement_timeout"
    if isinstance(exc, ClaimLost):
        return "claim_lost"
    if isinstance(exc, PublishFailed):
        return "publish_failed"
    return "transient"
