"""A real worker against real Kafka, PostgreSQL and Redis: decisions, duplicates of every
kind, conflicts and declines, checked in the database, on the output topic and the DLQ."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal

from service.adapters.redis_cache import RedisDedupCache
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up, wait_until


def _ids(prefix: str, *names: str) -> dict[str, str]:
    run = uuid.uuid4().hex[:8]
    return {n: f"{prefix}-{run}-{n}" for n in names}






async def forget_cached(url: str, txn_id: str) -> None:
    cache = RedisDedupCache.from_url(url, ttl_seconds=86_400, timeout_seconds=2)
    try:
        await cache.forget([txn_id])
    finally:
        await cache.close()


def test_decisions_duplicates_conflicts_and_declines(env, spawn_worker) -> None:
    t = _ids("TXN", "ok", "poor", "ghost", "usd", "blocked")
    acc = _ids("ACC", "eur", "usd", "blk")
    asyncio.run(stack.seed_accounts(env.dsn, [(acc["eur"], "1000.00", "EUR"),
                                              (acc["usd"], "50.00", "USD")]))
    asyncio.run(stack.seed_accounts(env.dsn, [(acc["blk"], "500.00", "EUR")], status="BLOCKED"))

    first = auth_message(t["ok"], account_id=acc["eur"], amount="125.50")
    records = [
        first,
        first,  # redelivery of the very same message
        {**first, "headers": {**first["headers"], "message_id": "msg-producer-retry"}},
        auth_message(t["ok"], account_id=acc["eur"], amount="999.00"),  # conflict
        auth_message(t["poor"], account_id=acc["eur"], amount="5000.00"),
        auth_message(t["ghost"], account_id="ACC-NOBODY", amount="1.00"),
        auth_message(t["usd"], account_id=acc["usd"], amount="1.00", currency="EUR"),
        auth_message(t["blocked"], account_id=acc["blk"], amount="1.00"),
    ]
    stack.produce(env.input_topic, [(acc["eur"], encode(r)) for r in records] +
                  [(acc["eur"], b'{"not": "an authorization"'), (acc["eur"], None)])

    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    m = worker.metrics()
    assert m['payauth_messages_total{outcome="approved"}'] == 1
    assert m['payauth_messages_total{outcome="declined"}'] == 4
    assert m['payauth_messages_total{outcome="duplicate"}'] == 2
    assert m['payauth_messages_total{outcome="conflict"}'] == 1
    assert m['payauth_messages_total{outcome="invalid"}'] == 2
    assert m['payauth_duplicates_total{layer="postgres"}'] == 2
    assert m['payauth_dead_letters_total{reason="INVALID_JSON"}'] == 2
    assert m['payauth_dead_letters_total{reason="IDEMPOTENCY_KEY_CONFLICT"}'] == 1

    ledger = stack.fetch(env.dsn, "SELECT txn_id, amount FROM ledger_entries")
    assert [(r["txn_id"], r["amount"]) for r in ledger] == [(t["ok"], Decimal("-125.50"))]
    balance = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1", acc["eur"])
    assert balance[0]["balance"] == Decimal("874.50")
    rows = stack.fetch(env.dsn, "SELECT txn_id, result, decline_reason FROM processed_transactions")
    results = {r["txn_id"]: (r["result"], r["decline_reason"]) for r in rows}
    assert results == {
        t["ok"]: ("APPROVED", None),
        t["poor"]: ("DECLINED", "INSUFFICIENT_FUNDS"),
        t["ghost"]: ("DECLINED", "UNKNOWN_ACCOUNT"),
        t["usd"]: ("DECLINED", "CURRENCY_MISMATCH"),
        t["blocked"]: ("DECLINED", "ACCOUNT_BLOCKED"),
    }

    events = stack.events_of(stack.read_topic(env.output_topic, expect=5))
    by_txn = {e["transaction_id"]: e for e in events}
    assert len(events) == 5, "one event per decided transaction"
    ok = by_txn[t["ok"]]
    assert ok["event_type"] == "PaymentAuthorized" and ok["result"] == "APPROVED"
    assert ok["amount"] == "125.50" and ok["decline_reason"] is None
    assert ok["correlation_id"] == first["headers"]["correlation_id"]
    assert by_txn[t["poor"]]["event_type"] == "PaymentDeclined"
    assert by_txn[t["poor"]]["decline_reason"] == "INSUFFICIENT_FUNDS"

    dlq = stack.read_topic(env.dlq_topic, expect=3)
    reasons = sorted(dict(r.headers())["error.reason"].decode() for r in dlq)
    assert reasons == ["IDEMPOTENCY_KEY_CONFLICT", "INVALID_JSON", "INVALID_JSON"]
    for rec in dlq:
        headers = dict(rec.headers())
        assert headers["source.topic"].decode() == env.input_topic
        assert int(headers["source.offset"]) >= 0 and headers["error.detail"]
    conflict = next(r for r in dlq
                    if dict(r.headers())["error.reason"] == b"IDEMPOTENCY_KEY_CONFLICT")
    assert conflict.value() == encode(records[3]), "the original bytes, unchanged"

    # Lag per partition comes from librdkafka's statistics (every 5 s): all caught up.
    def lag() -> dict[str, float]:
        return {k: v for k, v in worker.metrics().items() if k.startswith("payauth_consumer_lag")}

    wait_until(lambda: len(lag()) == env.partitions, 20, "lag metrics for every partition")
    assert set(lag().values()) == {0}
    assert worker.metrics()['payauth_dedup_lookup_seconds_count{store="postgres"}'] >= 1
    assert worker.metrics()['payauth_dedup_lookup_seconds_count{store="redis"}'] >= 1

    # Redelivered later: Redis answers now, nothing moves, nothing is published again.
    stack.produce(env.input_topic, [(acc["eur"], encode(first))])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: worker.metrics()['payauth_duplicates_total{layer="redis"}'] == 1, 10,
               "the Redis layer to count the redelivery")
    assert len(stack.fetch(env.dsn, "SELECT 1 FROM ledger_entries")) == 1
    assert worker.terminate() == 0


def test_a_redelivered_decline_is_answered_identically(env, spawn_worker) -> None:
    """A decline is a stored result: if its event was never confirmed (crash before the
    confirmation), the redelivery republishes the very same event, and decides nothing."""
    t = _ids("TXN", "poor")
    acc = _ids("ACC", "a")
    asyncio.run(stack.seed_accounts(env.dsn, [(acc["a"], "10.00", "EUR")]))
    msg = auth_message(t["poor"], account_id=acc["a"], amount="20.00")
    stack.produce(env.input_topic, [(acc["a"], encode(msg))])
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    first = stack.events_of(stack.read_topic(env.output_topic, expect=1))

    # Simulate the crash window: the batch's publication receipt and the Redis key are lost.
    assert stack.fetch(env.dsn, "DELETE FROM published_batches RETURNING 1"), "no receipt"
    asyncio.run(forget_cached(env.redis_url, t["poor"]))
    # Meanwhile money arrived: a fresh decision would approve. The stored one must win.
    stack.fetch(env.dsn, "UPDATE accounts SET balance = 100, opening_balance = 100")
    stack.produce(env.input_topic, [(acc["a"], encode(msg))])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    events = stack.events_of(stack.read_topic(env.output_topic, expect=2))
    assert len(events) == 2
    assert events[1] == first[0], "the repeat is the same event, same event_id"
    assert events[1]["result"] == "DECLINED"
    assert stack.fetch(env.dsn, "SELECT 1 FROM ledger_entries") == []
    assert worker.metrics()['payauth_events_published_total{kind="republish"}'] == 1
    assert worker.terminate() == 0
