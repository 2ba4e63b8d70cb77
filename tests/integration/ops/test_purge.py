"""``payauth purge`` (``service/adapters/retention.py`` through ``service/ops/purge.py``):
the window kept, older records deleted, and the ledger still guarding a purged one."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until


def test_purge_keeps_the_window_and_the_ledger_still_guards(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    old, new = f"OLD-{uuid.uuid4().hex[:10]}", f"NEW-{uuid.uuid4().hex[:10]}"
    messages = {t: auth_message(t, account_id=account, amount="10.00") for t in (old, new)}
    stack.produce(env.input_topic, [(account, encode(m)) for m in messages.values()])
    worker = spawn_worker(env, PAYAUTH_REDIS_URL="redis://127.0.0.1:1/0")  # no fast path
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = now() - interval '100 hours' WHERE txn_id = $1", old)

    aged, fresh = uuid.uuid4(), uuid.uuid4()  # publication receipts, purged by age too
    stack.fetch(env.dsn, "INSERT INTO published_batches VALUES "
                         "($1, now() - interval '100 hours'), ($2, now())", aged, fresh)

    result = payauth(env, "purge", "--batch-size", "1")
    assert result.returncode == 0, result.stderr
    assert "deleted 1 dedup record(s) older than 72 h" in result.stdout
    kept = [r["txn_id"] for r in stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")]
    assert kept == [new]
    receipts = {r["batch_id"]
                for r in stack.fetch(env.dsn, "SELECT batch_id FROM published_batches")}
    assert aged not in receipts and fresh in receipts
    # The record kept still counts as published: its batch's receipt was kept.
    assert stack.fetch(env.dsn, "SELECT 1 FROM processed_transactions p JOIN published_batches b "
                                "USING (batch_id) WHERE p.txn_id = $1", new)

    # The old transaction is redelivered after its dedup record is gone: the ledger's unique
    # txn_id still recognises it. No second debit.
    stack.produce(env.input_topic, [(account, encode(messages[old]))])
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: worker.metrics()['payauth_duplicates_total{layer="postgres"}'] == 1, 30,
               "the redelivery to be a duplicate")
    assert stack.fetch(env.dsn, "SELECT balance FROM accounts")[0]["balance"] == Decimal("80.00")
    assert worker.terminate() == 0
