"""A batch whose statement exceeds ``PAYAUTH_STATEMENT_TIMEOUT_MS`` does not stall its
partitions: it is decided in halves, in order, each split again while it too exceeds the
timeout, never retried whole (which could time out for ever). A real worker, a real
PostgreSQL whose claims are slowed by a trigger of the test's own (a fixed time per row, so
that a batch's time grows with its size)."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import wait_caught_up

_SLOW_CLAIMS = """
CREATE FUNCTION test_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.05);
    RETURN NEW;
END $$;
CREATE TRIGGER test_slow_claim BEFORE INSERT ON processed_transactions
    FOR EACH ROW EXECUTE FUNCTION test_slow_claim();
"""


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# One partition: the worker starts fetching each partition when its start offset is known,
# at slightly different moments, so over four partitions its batches could each hold one
# partition's 16 messages, all of which fit. Over one, its first fetch holds all 64.
@pytest.mark.partitions(1)
def test_a_batch_past_its_statement_timeout_is_decided_in_halves(env, spawn_worker) -> None:
    """64 purchases waiting before the worker starts, one batch of up to 64: 50 ms a claim
    makes any batch of more than 20 exceed the 1 s timeout, and any of 16 fit."""
    run = uuid.uuid4().hex[:6]
    accounts = [f"SLOW-{run}-{i}" for i in range(64)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "10.00", "EUR") for a in accounts]))
    asyncio.run(_execute(env.dsn, _SLOW_CLAIMS))
    stack.produce(env.input_topic, [
        (a.encode(), encode(auth_message(f"SLOW-{run}-T{i}", account_id=a, amount="1.00")))
        for i, a in enumerate(accounts)])
    worker = spawn_worker(env, PAYAUTH_STATEMENT_TIMEOUT_MS="1000",
                          PAYAUTH_LOCK_TIMEOUT_MS="5000", PAYAUTH_MAX_BATCH_SIZE="64",
                          PAYAUTH_LOG_LEVEL="INFO")
    wait_caught_up(env.group_id, env.input_topic, env.partitions, timeout=180)

    decided = stack.fetch(env.dsn, "SELECT count(*) AS n FROM processed_transactions "
                                   "WHERE txn_id LIKE $1", f"SLOW-{run}-%")
    assert decided[0]["n"] == 64
    splits = worker.events("batch_split")
    assert splits and all(e["cause"] == "statement_timeout" for e in splits), splits
    # Never the same batch again whole: every retry for a timeout is of a lone message.
    retried = [e for e in worker.events("batch_retry") if e["cause"] == "statement_timeout"]
    assert all(e["messages"] == 1 for e in retried), retried
    m = worker.metrics()
    assert m['payauth_retries_total{cause="statement_timeout"}'] == len(splits)
    assert m['payauth_messages_total{outcome="approved"}'] == 64
