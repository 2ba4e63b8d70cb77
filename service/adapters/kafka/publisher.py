"""``Publisher`` (implements ``ports.Publisher``): produce with the thread-safe ``Producer`` and
await the broker's acknowledgements from asyncio; a small thread serves the delivery reports,
which resolve one future per batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from service.adapters.kafka.config import (
    AUTHENTICATION_REFUSED,
    AUTHORIZATION_REFUSED,
    producer_config,
)
from service.config import Settings
from service.core.ports import PublishFailed, Record, Refusals

log = structlog.get_logger(__name__)


# Refusals a record meets again whatever the retry: it is larger than a limit.
_SIZE_REFUSALS = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}


class _BatchAck:
    """Counts a batch's delivery reports in the delivery thread; wakes the event loop once,
    when the last one arrives (a wake-up per record would cost more than the record)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int,
                 refusals: Refusals | None = None) -> None:
        self._loop = loop
        self._refusals = refusals
        self._refused = False
        self._lock = threading.Lock()
        self._remaining = count
        self._errors: list[str] = []
        self._too_large = False
        self.future: asyncio.Future[None] = loop.create_future()

    def on_delivery(self, err: KafkaError | None, msg: Message | None,
                    topic: str | None = None) -> None:
        """A delivery report (librdkafka's ``err, msg``), or a record refused before it was
        queued (no ``msg``: the caller names the ``topic``)."""
        with self._lock:
            if err is not None:
                self._errors.append(err.str())
                self._too_large |= err.code() in _SIZE_REFUSALS
                if err.code() in AUTHORIZATION_REFUSED and not self._refused:
                    self._refused = True
                    topic = msg.topic() if msg is not None else topic
                    if self._refusals is not None:
                        self._refusals.refused(
                            "kafka producer", f"{err.str()} (topic {topic or '?'})")
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self._errors:
            self.future.set_exception(PublishFailed(
                f"{len(self._errors)} record(s) not acknowledged: {self._errors[0]}",
                too_large=self._too_large))
        else:
            if self._refusals is not None:
                self._refusals.accepted("kafka producer")
            self.future.set_result(None)


class Publisher:
    """Produce and await the broker's acknowledgements from asyncio."""

    @classmethod
    def for_settings(cls, settings: Settings, loop: asyncio.AbstractEventLoop,
                     refusals: Refusals | None = None) -> Publisher:
        """A publisher on a producer of the settings' own (``producer_config``); a broker's
        refusal (credentials, certificate, a missing Write) is reported to ``refusals``."""
        conf = producer_config(settings)
        made: list[Publisher] = []

        def on_error(err: KafkaError) -> None:
            if err.fatal() and made:
                made[0].failed_for_good(err)
            elif refusals is not None and err.code() in AUTHENTICATION_REFUSED:
                refusals.refused("kafka connection", err.str())
        conf["error_cb"] = on_error
        made.append(cls(Producer(conf), loop, refusals))
        return made[0]

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop,
                 refusals: Refusals | None = None) -> None:
        self._producer = producer
        self._loop = loop
        self._refusals = refusals
        self.fatal: KafkaException | None = None  # set when librdkafka says it is for good
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-delivery", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                self._producer.poll(0.1)
            except KafkaException as exc:  # confluent-kafka raises a fatal error from poll()
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is not None and error.fatal():
                    self.failed_for_good(error)
                else:
                    log.warning("producer_poll_failed", error=str(exc)[:300])

    def failed_for_good(self, err: KafkaError) -> None:
        """librdkafka says the producer is unusable, e.g. InitProducerId refused to a
        principal that may write no topic: a refusal, and the worker stops (``fatal``)."""
        if self.fatal is None:
            log.error("kafka_fatal_error", client="producer", error=err.str())
            if self._refusals is not None:
                self._refusals.refused("kafka producer", err.str())
        self.fatal = KafkaException(err)

    async def publish(self, records: Sequence[Record]) -> None:
        """Send every record; return once Kafka acknowledged all of them (``acks=all``), or
        raise ``PublishFailed`` if any was refused or timed out. Records without headers
        (the result events) go in one ``produce_batch`` call per topic, in order (a record
        the local queue has no room for is queued again after the others): a call per record
        costs the worker more per event (docs/benchmark.md, "Design figures")."""
        if not records:
            return
        ack = _BatchAck(self._loop, len(records), self._refusals)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            if record.headers is None:
                by_topic.setdefault(record.topic, []).append(
                    {"key": record.key, "value": record.value})
            else:
                await self._produce_one(record, ack)
        for topic, messages in by_topic.items():
            await self._produce_batch(topic, messages, ack)
        await ack.future

    async def _produce_one(self, record: Record, ack: _BatchAck) -> None:
        """A record with headers (a dead letter), on its own: produce_batch drops headers."""
        headers: list[tuple[str, str | bytes | None]] = list(record.headers or ())
        while True:
            try:
                self._producer.produce(record.topic, value=record.value, key=record.key,
                                       headers=headers, on_delivery=ack.on_delivery)
                return
            except BufferError:
                await asyncio.sleep(0.01)  # local queue full: let deliveries drain it
            except KafkaException as exc:
                ack.on_delivery(exc.args[0], None, record.topic)
                return

    async def _produce_batch(self, topic: str, messages: list[dict[str, Any]],
                             ack: _BatchAck) -> None:
        """Queue ``messages``; the ones the local queue had no room for are queued again once
        deliveries drained it, the ones refused outright are counted as refused."""
        while messages:
            try:
                self._producer.produce_batch(topic, messages, on_delivery=ack.on_delivery)
            except KafkaException as exc:  # refused before any was queued (as produce would)
                for _ in messages:
                    ack.on_delivery(exc.args[0], None, topic)
                return
            except BufferError:
                # Documented, though this version reports a full queue per message instead;
                # whatever it queued is unknown: the batch is sent again (same event ids).
                raise PublishFailed("the producer's local queue is full") from None
            full = []
            for message in messages:
                error = message.pop("_error", None)
                if error is None:
                    continue
                if error.code() == KafkaError._QUEUE_FULL:
                    full.append(message)
                else:
                    ack.on_delivery(error, None, topic)
            messages = full
            if messages:
                await asyncio.sleep(0.01)

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))

    def close(self, timeout: float = 10.0) -> None:
        remaining = self.flush(timeout)
        if remaining:
            log.warning("producer_unflushed", messages=remaining)
        self._stopping.set()
        self._thread.join(timeout=2)
