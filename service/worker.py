"""``payauth run``: wires the worker together (the one composition root) and runs it until
SIGTERM/SIGINT, then shuts down in order:

    stop taking new messages → finish batches in progress → store and synchronously commit
    their offsets → close the consumer (leaves the group) → flush the producer → exit 0

``Wiring`` is the composition root's one seam: the test and chaos entry point
(``service/devtools/entry.py``) passes one that wraps the adapters with fault injectors;
``payauth run`` uses the plain adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from service import metrics
from service.adapters.kafka.admin import TopicConfigRefused, topic_max_message_bytes
from service.adapters.kafka.config import client_config
from service.adapters.kafka.consumer import ConsumerThread, Handoff, OffsetTracker
from service.adapters.kafka.publisher import Publisher as KafkaPublisher
from service.adapters.postgres import PostgresStore
from service.adapters.redis_cache import RedisDedupCache
from service.adapters.retention import purge_once
from service.config import Settings, database_plaintext
from service.core.dispatcher import Dispatcher
from service.core.pipeline import BatchProcessor, Topics
from service.core.plan import Limits
from service.core.ports import Cache, Publisher, Store, StoreRefused, StoreUnavailable
from service.domain.vocabulary import CardStatus
from service.health import Health, serve_http

log = structlog.get_logger(__name__)

# Messages a batch needs to run alongside another (``Dispatcher``'s ``overlap_from``).
SHARED_BATCH_MIN = 40


def _same(adapter: Any, *_: Any) -> Any:
    return adapter


@dataclass(frozen=True)
class Wiring:
    """How the adapters are built and wrapped; the default is production's."""

    store_class: type[PostgresStore] = PostgresStore
    wrap_store: Callable[[Store, Cache], Store] = _same
    wrap_cache: Callable[[Cache], Cache] = _same
    wrap_publisher: Callable[[Publisher], Publisher] = _same


async def connect_store(
    settings: Settings, stop: asyncio.Event, store_class: type[PostgresStore] = PostgresStore,
    health: Health | None = None,
) -> PostgresStore | None:
    """Connect to PostgreSQL, retrying with backoff while it is down or refuses us (None if
    stopped); a refusal is reported to ``health`` (``/readyz`` names it)."""
    delay = settings.retry_backoff_initial_ms / 1000
    while not stop.is_set():
        try:
            store = await store_class.connect(
                settings.database_url.get_secret_value(),
                min_size=settings.db_pool_min,
                max_size=settings.db_pool_max,
                statement_timeout_ms=settings.statement_timeout_ms,
                lock_timeout_ms=settings.lock_timeout_ms,
                limits_timezone=settings.limits_timezone,
            )
            if health is not None:
                health.accepted("postgres")
            return store
        except StoreRefused as exc:
            if health is not None:
                health.refused("postgres", str(exc)[:300])
            else:
                log.warning("postgres_refused_at_start", error=str(exc)[:300])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, settings.retry_backoff_max_ms / 1000)
        except StoreUnavailable as exc:
            log.warning("postgres_unavailable_at_start", error=str(exc)[:300], retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, settings.retry_backoff_max_ms / 1000)
    return None


async def run_worker(settings: Settings, wiring: Wiring | None = None) -> int:
    wiring = wiring or Wiring()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    health = Health()
    health.kafka_down_limit = settings.stalled_partition_seconds
    health.log_refusals_every(settings.kafka_log_interval_seconds)
    http = serve_http(settings.metrics_port, health)
    log.info("worker_starting", group_id=settings.group_id, topic=settings.input_topic,
             instance=settings.instance_id(), metrics_port=http.server_address[1])

    if database_plaintext(settings.database_url.get_secret_value()):
        log.warning("postgres_without_tls", reason="PAYAUTH_DATABASE_URL says sslmode=disable "
                    "to a host that is not loopback: card data would cross the network in "
                    "the clear")
    store = await connect_store(settings, stop, wiring.store_class, health)
    if store is None:
        http.shutdown()
        return 0
    health.postgres_ok = True
    dead_letter_max_bytes = await _dead_letter_limit(settings, health, stop)
    if dead_letter_max_bytes is None:  # stopped while the broker refused
        await store.close()
        http.shutdown()
        return 0
    cache = _redis_cache(settings, health)
    metrics.redis_up.set(1 if await cache.ping() else 0)
    publisher = KafkaPublisher.for_settings(settings, loop, health)
    tracker = OffsetTracker()
    wrapped_cache = wiring.wrap_cache(cache)  # the store's wrapper gets the plain one
    processor = BatchProcessor(
        wiring.wrap_store(store, cache), wrapped_cache,
        wiring.wrap_publisher(publisher), tracker,
        Topics(output=settings.output_topic, dlq=settings.dlq_topic),
        limits=Limits(max_message_bytes=settings.max_message_bytes,
                      max_refund=settings.max_refund_amount),
        dead_letter_max_bytes=dead_letter_max_bytes,
        backoff_initial=settings.retry_backoff_initial_ms / 1000,
        backoff_max=settings.retry_backoff_max_ms / 1000,
    )
    _tune_garbage_collector()
    dispatcher = Dispatcher(
        processor, finished_up_to=tracker.reported,
        max_batch=settings.max_batch_size,
        close_timeout=settings.shutdown_timeout_seconds * 0.8,
        max_in_flight=settings.max_concurrent_batches,
        # A batch alongside another only with this many messages (the smallest share worth
        # its round trips: docs/benchmark.md, "Design figures"), or a quarter of a full
        # batch when batches are small.
        overlap_from=min(SHARED_BATCH_MIN, max(1, settings.max_batch_size // 4)),
    )
    consumer = ConsumerThread(settings, Handoff(loop, dispatcher), tracker, health)
    await processor.refresh_replay_marks(settings.group_id, settings.input_topic)
    consumer.start()
    background = [
        asyncio.create_task(processor.confirmations.run()),
        asyncio.create_task(_heartbeat(health, processor, store, cache, dispatcher,
                                       settings.stalled_partition_seconds)),
        asyncio.create_task(_count_dedup_records(store, settings)),
        asyncio.create_task(_prepare_dedup_periods(store)),
        asyncio.create_task(_refresh_replay_marks(processor, settings)),
    ]
    if settings.purge_interval_seconds:
        background.append(asyncio.create_task(_purge_periodically(settings)))

    exit_code = 0
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if consumer.stopped.is_set():
                log.error("consumer_stopped", error=repr(consumer.fatal))
                exit_code = 1
                break
            if publisher.fatal is not None:
                log.error("producer_failed", error=str(publisher.fatal))
                exit_code = 1
                break
            failure = dispatcher.failed()
            if failure is not None:
                log.error("partition_task_failed", error=repr(failure))
                exit_code = 1
                break
    finally:
        # One budget for the whole stop, within the orchestrator's grace period: batches in
        # flight get most of it; what is not finished by then is replayed by the next owner.
        deadline = loop.time() + settings.shutdown_timeout_seconds

        def left(share: float = 1.0) -> float:
            return max(1.0, (deadline - loop.time()) * share)

        log.info("worker_stopping")
        try:
            await asyncio.wait_for(dispatcher.drain(), left(0.6))
        except TimeoutError:
            log.warning("stop_drain_timeout")
        consumer.stop()
        # The consumer thread stores and commits what finished and closes; keep the loop
        # running meanwhile, since its revoke callback calls back into it.
        await loop.run_in_executor(None, consumer.join, left(0.7))
        await loop.run_in_executor(None, publisher.close, left())
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await processor.confirmations.flush()
        await cache.close()
        await store.close()
        http.shutdown()
        log.info("worker_stopped", exit_code=exit_code)
    return exit_code


def _redis_cache(settings: Settings, health: Health) -> RedisDedupCache:
    """The fast path: one Redis by URL, or the master that Sentinels name."""
    if settings.redis_sentinels.strip():
        return RedisDedupCache.from_sentinels(
            settings.sentinel_addresses(), settings.redis_sentinel_master,
            settings.redis_url.get_secret_value(),
            sentinel_password=settings.redis_sentinel_password.get_secret_value(),
            ttl_seconds=settings.dedup_ttl_seconds,
            timeout_seconds=settings.redis_timeout_seconds, refusals=health)
    return RedisDedupCache.from_url(settings.redis_url.get_secret_value(),
                                    ttl_seconds=settings.dedup_ttl_seconds,
                                    timeout_seconds=settings.redis_timeout_seconds,
                                    refusals=health)


def _tune_garbage_collector() -> None:
    """Keep the cycle collector's pauses out of the latency tail.

    A batch allocates thousands of short-lived objects that reference counting frees; with
    the default thresholds they still trigger frequent collections, the full ones long
    enough to stall every batch in flight (docs/benchmark.md, "Design figures"). Everything
    alive after start-up (modules, schemas, connections) is frozen out of the collector's
    scans, and a collection waits for 20,000 net new container objects; garbage cycles are
    still reclaimed.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


async def _dead_letter_limit(settings: Settings, health: Health,
                             stop: asyncio.Event) -> int | None:
    """The largest dead-letter record Kafka takes: the producer's ``message.max.bytes`` or the
    dead-letter topic's ``max.message.bytes``, whichever is lower (stated in the log).

    A broker that refuses to describe the topic (no DescribeConfigs ACL) is a deployment
    error: the worker waits, not ready and saying why, and goes on once the ACL exists
    (None: stopped meanwhile). A broker that is away costs only the topic's limit."""
    loop = asyncio.get_running_loop()
    delay = settings.retry_backoff_initial_ms / 1000
    while not stop.is_set():
        try:
            topic_limit = await loop.run_in_executor(
                None, topic_max_message_bytes, client_config(settings), settings.dlq_topic)
        except TopicConfigRefused as exc:
            health.refused("kafka dead-letter topic", str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, settings.retry_backoff_max_ms / 1000)
            continue
        health.accepted("kafka dead-letter topic")
        return _log_size_limits(settings, topic_limit)
    return None


def _log_size_limits(settings: Settings, topic_limit: int | None) -> int:
    limits = [settings.kafka_message_max_bytes] + ([topic_limit] if topic_limit else [])
    log.info("kafka_size_limits", producer_message_max_bytes=settings.kafka_message_max_bytes,
             dlq_topic_max_message_bytes=topic_limit, dead_letter_max_bytes=min(limits),
             input_max_message_bytes=settings.max_message_bytes)
    return min(limits)


async def _heartbeat(
    health: Health, processor: BatchProcessor, store: PostgresStore, cache: RedisDedupCache,
    dispatcher: Dispatcher, stall_seconds: float,
) -> None:
    """Tick the loop's liveness; keep readiness' view of PostgreSQL, of stalled partitions
    and ``payauth_redis_up`` current even while no message flows."""
    while True:
        health.loop_heartbeat()
        health.report_refusals()
        ages = {tp[1]: age for tp, age in dispatcher.oldest_unfinished().items()}
        for _topic, partition in health.assigned:
            metrics.oldest_unfinished_seconds.labels(str(partition)).set(
                round(ages.get(partition, 0.0), 1))
        health.stalled = [p for p, age in ages.items() if age > stall_seconds]
        health.postgres_ok = processor.store_ok and await store.ping()
        if health.postgres_ok:
            health.accepted("postgres")
        metrics.redis_up.set(1 if await cache.ping() else 0)
        await asyncio.sleep(2)


async def _prepare_dedup_periods(store: PostgresStore) -> None:
    """The dedup store's partitions of the period under way and the ones ahead, made at
    start and then every quarter of a period (at most hourly), whether or not this worker
    purges: a claim never waits for one. (Claims made without it go to the default
    partition, and move to their period's as it is made.)"""
    every_seconds = 3_600.0
    while True:
        try:
            _, period_seconds = await store.prepare_dedup_periods()
            every_seconds = min(3_600.0, period_seconds / 4)
        except Exception as exc:  # housekeeping: never stop the worker for it
            log.warning("dedup_periods_failed", error=str(exc)[:300])
        await asyncio.sleep(every_seconds)


async def _purge_periodically(settings: Settings) -> None:
    while True:
        await asyncio.sleep(settings.purge_interval_seconds)
        try:
            await purge_once(settings.database_url.get_secret_value(),
                             retention_hours=settings.dedup_retention_hours,
                             pause_seconds=0.05, connect_timeout=10)
        except Exception as exc:  # retention is housekeeping: never stop the worker for it
            log.warning("purge_failed", error=str(exc)[:300])


async def _refresh_replay_marks(processor: BatchProcessor, settings: Settings,
                                every_seconds: float = 30) -> None:
    """A replay happens while no worker runs: reading the marks at start and then now and
    then is enough to label the replay's duplicates."""
    while True:
        await processor.refresh_replay_marks(settings.group_id, settings.input_topic)
        await asyncio.sleep(every_seconds)


async def _count_dedup_records(store: PostgresStore, settings: Settings,
                               every_seconds: float = 60) -> None:
    metrics.dedup_retention_seconds.set(settings.dedup_retention_hours * 3600)
    seen: set[str] = set()  # currencies with holds once: shown at 0 when none is left
    while True:
        try:
            records, size = await store.dedup_store_size()
            metrics.dedup_records.set(records)
            metrics.dedup_store_bytes.set(size)
            g = await store.lifecycle_gauges(settings.hold_expiry_hours)
            now = dict(zip(g["currencies"], zip(g["counts"], g["amounts"], strict=True),
                           strict=True))
            seen |= set(now)
            for currency in seen:
                count, amount = now.get(currency, (0, 0.0))
                metrics.holds_active.labels(currency).set(count)
                metrics.holds_active_amount.labels(currency).set(amount)
            metrics.holds_overdue.set(g["overdue"])
            metrics.holds_expired.set(g["expired"])
            metrics.holds_expiry_unpublished.set(g["unpublished"])
            metrics.orphan_reversals_waiting.set(g["orphans"])
            metrics.dedup_oldest_age_seconds.set(g["oldest_dedup_seconds"] or 0)
            c = await store.controls_gauges(settings.limits_timezone)
            frozen = dict(zip(c["statuses"], c["counts"], strict=True))
            for status in CardStatus:  # every status that declines, 0 when none
                if status is not CardStatus.ACTIVE:
                    metrics.cards_not_active.labels(status.value).set(frozen.get(status, 0))
            metrics.limit_usage_ratio.clear()
            for limit_id, ratio in zip(c["limit_ids"], c["ratios"], strict=True):
                metrics.limit_usage_ratio.labels(limit_id).set(ratio)
        except Exception as exc:
            log.debug("dedup_count_failed", error=str(exc)[:200])
        await asyncio.sleep(every_seconds)
