"""The operations tests' scenario: a "bug" (a validation setting that dead-letters a good
message) met by a worker, then fixed by setting it back; replay and dlq redrive are each
tested on it (tests/integration/ops)."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until

SMALL = "1024"  # the "bug": a size limit that refuses a legitimate, larger message


def balances(dsn: str) -> dict[str, Decimal]:
    return {r["account_id"]: r["balance"] for r in stack.fetch(dsn, "SELECT * FROM accounts")}


def setup_bug(env: stack.Env, spawn_worker: Any) -> tuple[list[str], str, str]:
    """30 normal authorizations and one large one that the buggy setting dead-letters.
    Returns the transaction ids, the large one's id and account, and the stopped worker."""
    accounts = [f"ACC-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "1000.00", "EUR") for a in accounts]))
    txns = [f"OPS-{uuid.uuid4().hex[:12]}" for _ in range(30)]
    big_txn = f"BIG-{uuid.uuid4().hex[:12]}"
    big = auth_message(big_txn, account_id=accounts[0], amount="100.00",
                       merchant_address="x" * 1500)
    records = [(accounts[i % 3], encode(auth_message(t, account_id=accounts[i % 3],
                                                     amount="1.00")))
               for i, t in enumerate(txns)]
    records.insert(10, (accounts[0], encode(big)))
    stack.produce(env.input_topic, records)
    buggy = spawn_worker(env, "buggy", PAYAUTH_MAX_MESSAGE_BYTES=SMALL)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    assert buggy.metrics()['payauth_dead_letters_total{reason="TOO_LARGE"}'] == 1
    assert buggy.terminate() == 0
    wait_until(lambda: "active member" not in payauth(env, "replay", "--to-earliest").stderr,
               60, "the group to have no members")
    return txns, big_txn, accounts[0]
