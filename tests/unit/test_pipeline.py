"""The commit order's runner: what it publishes, caches, retries and reports as finished,
with in-memory stand-ins that implement the ports (``service/core/ports.py``; the adapters
themselves are tested against the real services in tests/integration)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest

from service import metrics
from service.core.pipeline import BatchProcessor, Topics
from service.core.plan import Limits
from service.core.ports import TP, ClaimLost, DataRejected, PublishFailed, Record, StoreUnavailable
from service.domain.dedup import StoredResult
from service.domain.messages import Authorization, decode_authorization
from service.domain.vocabulary import DuplicateCause, Result
from tests.support.factory import auth_message, encode


@dataclass
class Msg:
    raw: bytes | None
    off: int

    def value(self) -> bytes | None:
        return self.raw

    def key(self) -> bytes | None:
        return b"k"

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.off

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return None


@dataclass
class Store:
    records: dict[str, StoredResult] = field(default_factory=dict)
    failures: list[Exception] = field(default_factory=list)
    reject_txn: str | None = None
    poison_txn: str | None = None  # a batch holding it fails with an unexpected error
    answers: bool = True  # what ping() says
    pings: int = 0
    pinged_often: asyncio.Event = field(default_factory=asyncio.Event)  # 20 pings
    commits: int = 0
    published: list[str] = field(default_factory=list)
    receipts: list[UUID] = field(default_factory=list)
    sightings: list[Any] = field(default_factory=list)
    # Decided by another replica while this store's call waits for them: recorded at the
    # call and left out of its answer (what a lost claim does to payauth_authorize).
    won_elsewhere: dict[str, StoredResult] = field(default_factory=dict)
    lost_unfound: int = 0  # calls that leave their first key out but record it nowhere
    away: bool = False  # PostgreSQL away: pings unanswered, every batch unavailable

    async def ping(self) -> bool:
        self.pings += 1
        if self.pings >= 20:
            self.pinged_often.set()
        return self.answers and not self.away

    async def load_stored(self, txn_ids: Sequence[str]) -> dict[str, StoredResult]:
        return {t: self.records[t] for t in txn_ids if t in self.records}

    async def authorize(self, new: Sequence[Authorization], **_: object) -> list[StoredResult]:
        if self.away:
            raise StoreUnavailable("connection refused")
        if self.failures:
            raise self.failures.pop(0)
        if self.reject_txn and any(a.transaction_id == self.reject_txn for a in new):
            raise DataRejected("check violation")
        if self.poison_txn and any(a.transaction_id == self.poison_txn for a in new):
            raise TypeError("a bug this input reaches (card 4111111111111111)")
        self.commits += 1
        batch = uuid4()
        out = []
        lost = {a.transaction_id for a in new if a.transaction_id in self.won_elsewhere}
        for txn in lost:
            self.records[txn] = self.won_elsewhere.pop(txn)
        if self.lost_unfound and new:
            self.lost_unfound -= 1
            lost.add(new[0].transaction_id)
        for a in new:
            if a.transaction_id in lost:
                continue
            rec = StoredResult(a.transaction_id, a.fingerprint, Result.APPROVED, None,
                               a.account_id, a.amount_text, a.currency,
                               a.authorization_type.value, a.correlation_id,
                               datetime.now(UTC), False, batch)
            self.records[a.transaction_id] = rec
            out.append(rec)
        return out

    async def record_sightings(self, sightings: Sequence[Any]) -> None:
        self.sightings += list(sightings)

    async def replay_marks(self, group_id: str, topic: str) -> dict[int, int]:
        return {}

    async def mark_published(self, batch_ids: Sequence[UUID], txn_ids: Sequence[str]) -> None:
        self.receipts += batch_ids
        self.published += txn_ids
        for t, r in self.records.items():
            if r.batch_id in batch_ids or t in txn_ids:
                self.records[t] = replace(r, published=True)


@dataclass
class Cache:
    data: dict[str, str] = field(default_factory=dict)
    up: bool = True

    async def get_many(self, txn_ids: Sequence[str]) -> dict[str, str]:
        return {t: self.data[t] for t in txn_ids if t in self.data}

    async def set_many(self, fingerprints: dict[str, str]) -> bool:
        self.data.update(fingerprints)
        return True


@dataclass
class Sender:
    sent: list[tuple[str, bytes | None]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    fail_next: int = 0
    refuse_above: int | None = None  # a broker whose limit is lower than the worker thinks

    async def publish(self, records: Sequence[Record]) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise PublishFailed("broker said no")
        if self.refuse_above and any(len(r.value or b"") > self.refuse_above for r in records):
            raise PublishFailed("Broker: Message size too large", too_large=True)
        self.sent += [(r.topic, r.value) for r in records]
        self.records += records


@dataclass
class Offsets:
    """The offset sink; notes how much was published when each report came."""

    sender: Sender | None = None
    reports: list[tuple[TP, int, int, int]] = field(default_factory=list)

    def done(self, tp: TP, next_offset: int, count: int) -> None:
        published = len(self.sender.records) if self.sender else -1
        self.reports.append((tp, next_offset, count, published))


def processor(store: Store, cache: Cache, sender: Sender, offsets: Offsets | None = None,
              **options: Any) -> BatchProcessor:
    if "max_message_bytes" in options:
        options["limits"] = Limits(max_message_bytes=options.pop("max_message_bytes"))
    return BatchProcessor(store, cache, sender, offsets or Offsets(sender), Topics("out", "dlq"),
                          backoff_initial=0.001, backoff_max=0.002, **options)


def msgs(*messages: dict[str, object] | bytes) -> list[Msg]:
    return [Msg(m if isinstance(m, bytes) else encode(m), i) for i, m in enumerate(messages)]


async def test_cache_is_written_only_after_commit_and_publish() -> None:
    store, cache, sender = Store(), Cache(), Sender()
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1")))
    assert store.commits == 1 and [t for t, _ in sender.sent] == ["out"]
    assert cache.data == {} and store.receipts == [], "confirmed later, never before"
    await p.confirmations.flush()
    # A receipt for the batch that decided it, not an update of its record.
    assert set(cache.data) == {"T1"} and store.receipts == [store.records["T1"].batch_id]
    assert store.published == [] and store.records["T1"].published


async def test_a_redis_hit_with_another_fingerprint_is_a_conflict_not_a_duplicate() -> None:
    store, cache, sender = Store(), Cache(), Sender()
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1", amount="10.00")))
    await p.confirmations.flush()
    await p.process(msgs(auth_message("T1", amount="99.00")))
    assert [t for t, _ in sender.sent] == ["out", "dlq"]
    assert store.commits == 1


def _duplicates(layer: str) -> float:
    return sum(metrics.duplicates_total.labels(layer, cause.value)._value.get()
               for cause in DuplicateCause)


async def test_a_redelivery_is_recognised_by_its_key_fields_before_the_schema_check() -> None:
    store, cache, sender = Store(), Cache(), Sender()
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1", amount="10.50")))
    await p.confirmations.flush()
    redis_before, pg_before = _duplicates("redis"), _duplicates("postgres")
    # Same key fields, other fields the schema would refuse: the transaction was decided,
    # nothing of this copy is stored, logged or published, so it is a duplicate.
    await p.process(msgs(auth_message("T1", amount="10.50", merchant_category="ABCD")))
    assert (_duplicates("redis"), _duplicates("postgres")) == (redis_before + 1, pg_before)
    # The same amount written differently is validated and found in PostgreSQL instead.
    await p.process(msgs(auth_message("T1", amount="10.5")))
    assert (_duplicates("redis"), _duplicates("postgres")) == (redis_before + 1, pg_before + 1)
    # Card data is refused whatever the key fields say.
    await p.process(msgs(auth_message("T1", amount="10.50", merchant="Shop 4111111111111111")))
    assert [t for t, _ in sender.sent] == ["out", "dlq"] and store.commits == 1
    assert b"4111111111111111" in (sender.sent[-1][1] or b"")  # the original bytes, DLQ only


async def test_transient_failures_are_retried_until_they_pass() -> None:
    store = Store(failures=[StoreUnavailable("down"), ClaimLost("lost")])
    cache, sender = Cache(), Sender(fail_next=1)
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1")))
    await p.confirmations.flush()
    assert store.commits == 1
    # The failed publish was repeated from the stored, unconfirmed result.
    assert [t for t, _ in sender.sent] == ["out"] and "T1" in cache.data


def _decided_elsewhere(txn: str, amount: str) -> StoredResult:
    a = decode_authorization(encode(auth_message(txn, amount=amount)))
    return StoredResult(txn, a.fingerprint, Result.APPROVED, None, a.account_id,
                        a.amount_text, a.currency, a.authorization_type.value, "corr-x",
                        datetime.now(UTC), False, uuid4(), source_partition=7)


def _retries(cause: str) -> float:
    return metrics.retries_total.labels(cause)._value.get()


@pytest.mark.parametrize("amount, topics", [("10.00", ["out", "out", "out"]),
                                            ("99.00", ["out", "out", "dlq"])])
async def test_a_claim_lost_costs_its_own_message_not_the_batch(amount: str,
                                                                topics: list[str]) -> None:
    """Another replica decides B (the same body: a duplicate; another: a conflict) while
    this batch waits for it: A and C are decided in the one commit, B looked up again and
    answered from the other's decision; the batch is not decided again."""
    store = Store(won_elsewhere={"B": _decided_elsewhere("B", amount)})
    cache, sender = Cache(), Sender()
    lost_before = _retries("claim_lost")
    await processor(store, cache, sender).process(
        msgs(auth_message("A"), auth_message("B"), auth_message("C")))
    assert store.commits == 1 and _retries("claim_lost") == lost_before + 1
    assert [t for t, _ in sender.sent] == topics  # (the events first, then dead letters)
    assert store.records["B"].source_partition == 7  # the other replica's decision stands
    if "dlq" not in topics:  # republished as the other decided it (never confirmed published)
        assert b'"correlation_id":"corr-x"' in (sender.sent[1][1] or b"").replace(b" ", b"")


async def test_claims_lost_that_no_lookup_finds_retry_the_batch_whole() -> None:
    """A store that keeps answering a key lost that its lookup cannot find (a fault): after
    three lookups the batch is retried whole, and each message still has one decision."""
    store, cache, sender = Store(lost_unfound=3), Cache(), Sender()
    await processor(store, cache, sender).process(
        msgs(auth_message("A"), auth_message("B")))
    assert store.commits == 4  # three lookups, each losing A; then the whole batch again
    assert sorted(store.records) == ["A", "B"]
    assert [t for t, _ in sender.sent] == ["out", "out"]


async def test_a_batch_resumes_when_postgres_answers_again_not_when_its_backoff_ends(
) -> None:
    """PostgreSQL away, then back 0.3 s later: the batch, in a backoff of at least 30 s by
    then, asks while it waits and is decided once the store answers."""
    store, cache, sender = Store(away=True), Cache(), Sender()
    p = BatchProcessor(store, cache, sender, Offsets(sender), Topics("out", "dlq"),
                       backoff_initial=30.0, backoff_max=60.0)

    async def back_soon() -> None:
        await asyncio.sleep(0.3)
        store.away = False

    comes_back = asyncio.create_task(back_soon())
    await asyncio.wait_for(p.process(msgs(auth_message("T1"))), 10)  # far below 30 s
    await comes_back
    assert store.commits == 1 and [t for t, _ in sender.sent] == ["out"]
    assert store.pings >= 2  # unanswered while away, then answered


async def test_a_store_that_answers_although_the_batch_failed_is_waited_out() -> None:
    """The batch failed as unavailable but the store answers its first question (a
    read-only node still in the pool, say): no retry at once, the backoff is waited out,
    one question asked."""
    store = Store(failures=[StoreUnavailable("read-only transaction")])
    cache, sender = Cache(), Sender()
    p = BatchProcessor(store, cache, sender, Offsets(sender), Topics("out", "dlq"),
                       backoff_initial=0.05, backoff_max=0.1)
    await p.process(msgs(auth_message("T1")))
    assert store.commits == 1 and store.pings == 1


async def test_a_row_the_database_refuses_is_isolated_and_dead_lettered() -> None:
    store, cache, sender = Store(reject_txn="BAD"), Cache(), Sender()
    await processor(store, cache, sender).process(
        msgs(auth_message("A"), auth_message("BAD"), auth_message("C")))
    assert sorted(store.records) == ["A", "C"]
    assert [t for t, _ in sender.sent].count("dlq") == 1


async def test_invalid_message_goes_to_the_dlq_with_its_bytes() -> None:
    store, cache, sender = Store(), Cache(), Sender()
    await processor(store, cache, sender).process(msgs(b"garbage"))
    assert sender.sent == [("dlq", b"garbage")] and store.commits == 0


@pytest.mark.parametrize("published", [True, False])
async def test_stored_duplicate_republishes_only_if_never_confirmed(published: bool) -> None:
    store, cache, sender = Store(), Cache(), Sender()
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1")))
    await p.confirmations.flush()
    if not published:
        store.records["T1"] = replace(store.records["T1"], published=False)  # receipt lost
    cache.data.clear()
    await p.process(msgs(auth_message("T1")))
    assert len(sender.sent) == (1 if published else 2)
    assert store.commits == 1
    await p.confirmations.flush()
    # A republished record is confirmed on its own: its batch's other records were not
    # republished, so no receipt is made for that batch.
    assert store.published == ([] if published else ["T1"])


async def test_a_message_that_fails_unexpectedly_is_isolated_and_dead_lettered() -> None:
    store, cache, sender = Store(poison_txn="POISON"), Cache(), Sender()
    batch = msgs(*(auth_message(t) for t in ("A", "B", "POISON", "D", "E")))
    await processor(store, cache, sender).process(batch)
    # Every other message is decided, the poison one dead-lettered alone, with why.
    assert sorted(store.records) == ["A", "B", "D", "E"]
    [letter] = [r for r in sender.records if r.topic == "dlq"]
    headers = dict(letter.headers or [])
    assert headers["error.reason"] == b"PROCESSING_FAILED"
    assert headers["error.detail"].startswith(b"TypeError")
    assert b"4111111111111111" not in headers["error.detail"], "masked"
    assert letter.value == batch[2].raw and headers["source.offset"] == b"2"


async def test_an_unexpected_failure_is_not_dead_lettered_while_postgres_is_away() -> None:
    store, cache, sender = Store(poison_txn="POISON", answers=False), Cache(), Sender()
    task = asyncio.create_task(processor(store, cache, sender).process(
        msgs(auth_message("POISON"))))
    await store.pinged_often.wait()  # it keeps retrying, asking PostgreSQL each time
    assert not task.done() and sender.records == []
    store.answers = True
    await task
    assert [r.topic for r in sender.records] == ["dlq"]


async def test_a_bug_in_decoding_one_message_dead_letters_only_that_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import service.core.plan as plan

    real = plan.decode_authorization

    def decode(raw: bytes | None, **kwargs: Any) -> Authorization:
        if raw and b"POISON" in raw:
            raise RecursionError("maximum recursion depth exceeded")
        return real(raw, **kwargs)

    monkeypatch.setattr(plan, "decode_authorization", decode)
    store, cache, sender = Store(), Cache(), Sender()
    await processor(store, cache, sender).process(
        msgs(auth_message("A"), auth_message("POISON"), auth_message("C")))
    assert sorted(store.records) == ["A", "C"]
    [letter] = [r for r in sender.records if r.topic == "dlq"]
    assert dict(letter.headers or [])["error.reason"] == b"PROCESSING_FAILED"


async def test_a_dead_letter_too_large_for_kafka_carries_a_preview_size_and_hash() -> None:
    import hashlib

    store, cache, sender = Store(), Cache(), Sender()
    big = b'{"x": "' + b"y" * 300_000 + b'"}'
    await processor(store, cache, sender, max_message_bytes=65_536,
                    dead_letter_max_bytes=100_000).process(msgs(big))
    [letter] = sender.records
    headers = dict(letter.headers or [])
    assert headers["error.reason"] == b"TOO_LARGE"
    assert headers["original.size"] == str(len(big)).encode()
    assert headers["original.sha256"] == hashlib.sha256(big).hexdigest().encode()
    assert letter.value == big[:1024]
    # One that fits goes whole, without those headers.
    small = b'{"x": "' + b"y" * 70_000 + b'"}'
    await processor(store, cache, sender, dead_letter_max_bytes=100_000).process(msgs(small))
    assert sender.records[-1].value == small
    assert "original.size" not in dict(sender.records[-1].headers or [])


async def test_a_broker_limit_lower_than_expected_lowers_the_dead_letter_limit() -> None:
    store, cache, sender = Store(), Cache(), Sender(refuse_above=50_000)
    big = b'{"x": "' + b"y" * 200_000 + b'"}'
    await processor(store, cache, sender, dead_letter_max_bytes=1_000_000).process(msgs(big))
    [letter] = sender.records
    assert letter.value == big[:1024] and dict(letter.headers or [])["original.truncated"]


async def test_offsets_are_reported_only_after_every_record_is_acknowledged() -> None:
    store, cache, sender = Store(), Cache(), Sender(fail_next=2)
    offsets = Offsets(sender)
    batch = msgs(auth_message("A"), b"garbage", auth_message("C"))
    await processor(store, cache, sender, offsets).process(batch)
    # One report, after the two events and the dead letter were acknowledged; none for the
    # two attempts Kafka refused.
    assert offsets.reports == [(("in", 0), 3, 3, 3)]


async def test_an_isolated_batch_reports_each_half_as_it_finishes() -> None:
    store, cache, sender = Store(poison_txn="P"), Cache(), Sender()
    offsets = Offsets(sender)
    await processor(store, cache, sender, offsets).process(
        msgs(auth_message("A"), auth_message("B"), auth_message("P"), auth_message("D")))
    assert [r[1] for r in offsets.reports] == [2, 3, 4]  # next offsets, in order


async def test_a_conflict_dead_letter_carries_the_first_decision_and_the_differences() -> None:
    store, cache, sender = Store(), Cache(), Sender()
    p = processor(store, cache, sender)
    await p.process(msgs(auth_message("T1", amount="10.00", account_id="ACC-1")))
    await p.process(msgs(auth_message("T1", amount="99.00", account_id="ACC-1",
                                      currency="USD")))
    [letter] = [r for r in sender.records if r.topic == "dlq"]
    headers = dict(letter.headers or [])
    assert headers["error.reason"] == b"IDEMPOTENCY_KEY_CONFLICT"
    assert headers["conflict.differences"] == b"amount: 10.00 -> 99.00; currency: EUR -> USD"
    assert headers["conflict.stored.result"] == b"APPROVED"
    assert headers["conflict.stored.amount"] == b"10.00"
    assert headers["conflict.stored.event_id"]
    assert b"amount: 10.00 -> 99.00" in headers["error.detail"]
    # The same id twice in one batch: the differences, without a stored decision.
    await p.process(msgs(auth_message("T2", amount="1.00"),
                         auth_message("T2", amount="1.00", authorization_type="REFUND")))
    last = dict(sender.records[-1].headers or [])
    assert last["conflict.differences"] == b"authorization_type: PURCHASE -> REFUND"
    assert "conflict.stored.result" not in last
