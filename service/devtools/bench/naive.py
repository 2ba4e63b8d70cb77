"""The baseline: the seed document's flow, followed literally, one message at a time.

Per message: Redis GET; BEGIN; SELECT … FOR UPDATE on the dedup row; SELECT the balance
FOR UPDATE; UPDATE; INSERT ledger; INSERT dedup record; COMMIT; produce and wait; Redis SET;
synchronous offset commit. It exists only to be measured against; it is not the service
(and it keeps the seed's race: FOR UPDATE on a missing dedup row locks nothing).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import redis.asyncio as aioredis
from confluent_kafka import Consumer, Producer

from service.domain.errors import InvalidMessage
from service.domain.messages import Authorization, decode_authorization
from service.domain.vocabulary import AuthorizationType, DeclineReason, Result


async def run_naive(*, bootstrap: str, topic: str, output: str, group: str, dsn: str,
                    redis_url: str, expected: int, max_seconds: float = 600) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    conn = await asyncpg.connect(dsn)
    cache = aioredis.Redis.from_url(redis_url, decode_responses=True)
    consumer.subscribe([topic])
    done = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    try:
        while done < expected and loop.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            try:
                auth = decode_authorization(msg.value())
            except InvalidMessage:
                consumer.commit(message=msg, asynchronous=False)
                done += 1
                continue
            if await cache.get(f"dedup:{auth.transaction_id}") is None:
                async with conn.transaction():
                    seen = await conn.fetchrow(
                        "SELECT result FROM processed_transactions WHERE txn_id = $1 FOR UPDATE",
                        auth.transaction_id)
                    if seen is None:
                        row = await conn.fetchrow(
                            "SELECT account_id, balance, currency, status FROM accounts "
                            "WHERE account_id = $1 FOR UPDATE", auth.account_id)
                        result, reason, delta = _seed_rule(auth, row)
                        now = datetime.now(UTC)
                        if result is Result.APPROVED:
                            await conn.execute(
                                "UPDATE accounts SET balance = balance + $2 WHERE account_id = $1",
                                auth.account_id, delta)
                            await conn.execute(
                                "INSERT INTO ledger_entries (txn_id, account_id, amount, currency,"
                                " type, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
                                auth.transaction_id, auth.account_id, delta,
                                auth.currency, auth.authorization_type.value, now)
                        await conn.execute(
                            "INSERT INTO processed_transactions (txn_id, processed_at, result, "
                            "decline_reason, fingerprint, account_id, amount, currency, "
                            "authorization_type, published_at) "
                            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $2)",
                            auth.transaction_id, now, result.value,
                            reason.value if reason else None,
                            auth.fingerprint, auth.account_id, auth.amount, auth.currency,
                            auth.authorization_type.value)
                        producer.produce(output, key=auth.account_id, value=json.dumps(
                            {"transaction_id": auth.transaction_id,
                             "result": result.value}).encode())
                        producer.flush(10)
                await cache.set(f"dedup:{auth.transaction_id}", auth.fingerprint, ex=86400)
            consumer.commit(message=msg, asynchronous=False)
            done += 1
        return done
    finally:
        consumer.close()
        await conn.close()
        await cache.aclose()


def _seed_rule(auth: Authorization, row: Any) -> tuple[Result, DeclineReason | None, Decimal]:
    """The seed's decision, in Python as the seed writes it, for this baseline only (the
    service decides in ``payauth_authorize``): (result, reason, signed balance change)."""
    if row is None:
        return Result.DECLINED, DeclineReason.UNKNOWN_ACCOUNT, Decimal(0)
    if row["status"] != "ACTIVE":
        return Result.DECLINED, DeclineReason.ACCOUNT_BLOCKED, Decimal(0)
    if row["currency"] != auth.currency:
        return Result.DECLINED, DeclineReason.CURRENCY_MISMATCH, Decimal(0)
    if auth.authorization_type is AuthorizationType.REFUND:
        return Result.APPROVED, None, auth.amount
    if row["balance"] < auth.amount:
        return Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS, Decimal(0)
    return Result.APPROVED, None, -auth.amount
