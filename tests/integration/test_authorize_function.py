"""The server-side payauth_authorize (one round trip per batch), the one place that decides,
decides exactly as the test oracle (tests/support/oracle.py) says, and writes nothing when a
claim is lost."""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from service.adapters.pg_columns import joined, split
from service.adapters.postgres import PostgresStore
from service.core.ports import ClaimLost
from service.domain.messages import Authorization, decode_authorization
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.oracle import Account, decide, decide_in_order, decide_in_order_with_inputs

ACCOUNTS = [  # id, balance, currency, status
    ("FN-A", "100.00", "EUR", "ACTIVE"),
    ("FN-B", "50.00", "EUR", "BLOCKED"),
    ("FN-C", "1000", "JPY", "ACTIVE"),
    ("FN-D", "5.00", "EUR", "ACTIVE"),
    ("FN-E", "0.00", "EUR", "ACTIVE"),
]


def _random_batch(rng: random.Random, tag: str, size: int) -> list[Authorization]:
    batch = []
    for i in range(size):
        account = rng.choice([a[0] for a in ACCOUNTS] + ["FN-UNKNOWN"])
        currency = rng.choice(["EUR", "EUR", "EUR", "JPY"])
        amount = (str(rng.randint(1, 400)) if currency == "JPY"
                  else f"{rng.randint(1, 6000) / 100:.2f}")
        kind = "REFUND" if rng.random() < 0.2 else "PURCHASE"
        batch.append(decode_authorization(encode(auth_message(
            f"FN-{tag}-{i}", account_id=account, amount=amount, currency=currency,
            authorization_type=kind))))
    return batch


async def _accounts(dsn: str) -> dict[str, Account]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT account_id, balance, currency, status FROM accounts")
        return {r["account_id"]: Account(r["account_id"], r["balance"], r["currency"].strip(),
                                         r["status"]) for r in rows}
    finally:
        await conn.close()


async def _seed(dsn: str) -> None:
    for account_id, balance, currency, status in ACCOUNTS:
        await stack.seed_accounts(dsn, [(account_id, balance, currency)], status=status)


async def _recorded_inputs(dsn: str, batch: list[Authorization]) -> list[Any]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(
            "SELECT txn_id, input_balance, input_status, input_currency, rule_version "
            "FROM processed_transactions WHERE txn_id = ANY($1::text[])",
            [a.transaction_id for a in batch]))
    finally:
        await conn.close()


def test_the_function_decides_as_the_domain_reference(env: stack.Env) -> None:
    async def scenario() -> None:
        await _seed(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        rng = random.Random(7)
        kinds: set[tuple[str, str | None]] = set()
        try:
            for round_number in range(6):
                batch = _random_batch(rng, str(round_number), 250)
                before = await _accounts(env.dsn)
                seen_and_decided = decide_in_order_with_inputs(batch, before)
                expected = [decision for _, decision in seen_and_decided]
                stored = await store.authorize(
                    batch, source_topic="t", source_partitions=[0] * len(batch),
                    source_offsets=list(range(len(batch))))
                got = [(s.result, s.decline_reason) for s in stored]
                assert got == [(d.result, d.decline_reason) for d in expected]
                kinds |= {(str(r), str(w) if w else None) for r, w in got}
                # Each decision's inputs are recorded as it read them (shadow replay's input).
                recorded = {r["txn_id"]: r for r in await _recorded_inputs(env.dsn, batch)}
                for auth, (seen, _) in zip(batch, seen_and_decided, strict=True):
                    row = recorded[auth.transaction_id]
                    assert row["rule_version"], auth.transaction_id
                    assert (row["input_balance"], row["input_status"], row["input_currency"]) \
                        == ((seen.balance, seen.status, seen.currency) if seen else
                            (None, None, None)), auth.transaction_id
                after = await _accounts(env.dsn)
                for account_id, account in before.items():
                    moved = sum((d.delta for a, d in zip(batch, expected, strict=True)
                                 if a.account_id == account_id), Decimal(0))
                    assert after[account_id].balance == account.balance + moved, account_id
        finally:
            await store.close()
        # Every rule was exercised, not just approvals.
        assert kinds == {("APPROVED", None), ("DECLINED", "INSUFFICIENT_FUNDS"),
                         ("DECLINED", "UNKNOWN_ACCOUNT"), ("DECLINED", "ACCOUNT_BLOCKED"),
                         ("DECLINED", "CURRENCY_MISMATCH")}

    asyncio.run(scenario())


def _auth(txn: str, account: str, amount: str, kind: str = "PURCHASE",
          currency: str = "EUR") -> Authorization:
    return decode_authorization(encode(auth_message(
        txn, account_id=account, amount=amount, currency=currency, authorization_type=kind)))


def test_the_edges_of_each_rule(env: stack.Env) -> None:
    # In offset order, each seeing what the ones before it left.
    edges = [
        (_auth("E1", "FN-D", "5.00"), ("APPROVED", None)),  # exactly the balance
        (_auth("E2", "FN-D", "0.01"), ("DECLINED", "INSUFFICIENT_FUNDS")),
        (_auth("E3", "FN-D", "1.00", "REFUND"), ("APPROVED", None)),
        (_auth("E4", "FN-D", "1.00"), ("APPROVED", None)),  # the refund, spent at once
        (_auth("E5", "FN-E", "0.01"), ("DECLINED", "INSUFFICIENT_FUNDS")),
        (_auth("E6", "FN-B", "1.00", "REFUND"), ("DECLINED", "ACCOUNT_BLOCKED")),
        (_auth("E7", "FN-C", "1.00", "REFUND"), ("DECLINED", "CURRENCY_MISMATCH")),
        (_auth("E8", "FN-NONE", "1.00", "REFUND"), ("DECLINED", "UNKNOWN_ACCOUNT")),
        (_auth("E9", "FN-C", "1000", currency="JPY"), ("APPROVED", None)),
    ]

    async def scenario() -> list[tuple[str, str | None]]:
        await _seed(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            batch = [a for a, _ in edges]
            reference = decide_in_order(batch, await _accounts(env.dsn))
            stored = await store.authorize(batch, source_topic="t",
                                           source_partitions=[0] * len(batch),
                                           source_offsets=list(range(len(batch))))
            assert [(s.result, s.decline_reason) for s in stored] == [
                (d.result, d.decline_reason) for d in reference]
            return [(str(s.result), str(s.decline_reason) if s.decline_reason else None)
                    for s in stored]
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [want for _, want in edges]
    balances = {r["account_id"]: r["balance"] for r in stack.fetch(
        env.dsn, "SELECT account_id, balance FROM accounts")}
    assert balances["FN-D"] == Decimal("0.00") and balances["FN-C"] == Decimal("0")


def test_a_lost_claim_writes_nothing_of_the_batch(env: stack.Env) -> None:
    async def scenario() -> tuple[dict[str, Account], dict[str, Account]]:
        await _seed(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            first = _random_batch(random.Random(1), "first", 20)
            await store.authorize(first, source_topic="t", source_partitions=[0] * 20,
                                  source_offsets=list(range(20)))
            balances = await _accounts(env.dsn)
            second = [*_random_batch(random.Random(2), "second", 20), first[5]]
            with pytest.raises(ClaimLost):
                await store.authorize(second, source_topic="t", source_partitions=[0] * 21,
                                      source_offsets=list(range(21)))
        finally:
            await store.close()
        return balances, await _accounts(env.dsn)

    before, after = asyncio.run(scenario())
    assert after == before
    rows = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions "
                                "WHERE txn_id LIKE 'FN-second-%'")
    ledger = stack.fetch(env.dsn, "SELECT txn_id FROM ledger_entries "
                                  "WHERE txn_id LIKE 'FN-second-%'")
    assert rows == [] and ledger == []


@pytest.mark.parametrize("values", [
    [], ["TXN-1"], [None], ["A", None, "B", None], [None, None], ["12.50", "0.001", "1000"],
    [f"TXN-{i}" for i in range(2_000)], ["!#$%&'()*+,-./:;<=>?@[]^_`{|}~\"", "\\", "ü €"],
])
def test_a_column_comes_back_from_the_server_as_it_was_sent(env: stack.Env,
                                                             values: list[str | None]) -> None:
    """The authorize call's columns go as joined texts that the server splits back into
    arrays (``pg_columns``): every value, NULL and order as sent."""
    [row] = stack.fetch(env.dsn, f"SELECT {split('$1')} AS column", joined(values))
    assert row["column"] == values
    numbers = [str(n) for n in range(-3, 3)] + [str(2**40)]
    [row] = stack.fetch(env.dsn, f"SELECT {split('$1', '::bigint[]')} AS column",
                        joined(numbers))
    assert row["column"] == [int(n) for n in numbers]


def test_a_lifecycle_batch_decides_purchases_and_refunds_as_the_reference(env: stack.Env
                                                                          ) -> None:
    """A batch holding any lifecycle kind goes to payauth_lifecycle whole: its purchases and
    refunds are decided, recorded and posted exactly as payauth_authorize decides them (the
    same random batches as above, each with an ADVICE on an account of its own)."""
    async def scenario() -> None:
        await _seed(env.dsn)
        await stack.seed_accounts(env.dsn, [("FN-HOLDS", "0.00", "EUR")])
        store = await PostgresStore.connect(env.dsn)
        rng = random.Random(7)
        try:
            for round_number in range(4):
                batch = _random_batch(rng, f"lc{round_number}", 150)
                advice = _auth(f"FN-lc{round_number}-advice", "FN-HOLDS", "1.00", "ADVICE")
                before = await _accounts(env.dsn)
                seen_and_decided = decide_in_order_with_inputs(batch, before)
                stored = await store.authorize(
                    [*batch, advice], source_topic="t",
                    source_partitions=[0] * (len(batch) + 1),
                    source_offsets=list(range(len(batch) + 1)))
                assert stored[-1].result == "APPROVED" and stored[-1].mismatch is None
                assert [(s.result, s.decline_reason) for s in stored[:-1]] == \
                    [(d.result, d.decline_reason) for _, d in seen_and_decided]
                recorded = {r["txn_id"]: r for r in await _recorded_inputs(env.dsn, batch)}
                for auth, (seen, _) in zip(batch, seen_and_decided, strict=True):
                    row = recorded[auth.transaction_id]
                    assert (row["input_balance"], row["input_status"], row["input_currency"]) \
                        == ((seen.balance, seen.status, seen.currency) if seen else
                            (None, None, None)), auth.transaction_id
                after = await _accounts(env.dsn)
                for account_id, account in before.items():
                    moved = sum((d.delta for a, (_, d) in zip(batch, seen_and_decided,
                                                              strict=True)
                                 if a.account_id == account_id), Decimal(0))
                    assert after[account_id].balance == account.balance + moved, account_id
        finally:
            await store.close()

    asyncio.run(scenario())
    ledger = stack.fetch(env.dsn, "SELECT l.txn_id, l.amount, p.amount AS sent, "
                                  "p.authorization_type FROM ledger_entries l "
                                  "JOIN processed_transactions p USING (txn_id)")
    assert ledger and all(r["amount"] == (r["sent"] if r["authorization_type"] == "REFUND"
                                          else -r["sent"]) for r in ledger)


def test_the_rule_decides_every_kind_as_the_reference(env: stack.Env) -> None:
    """payauth_decide on every kind, account state and currency (the lifecycle kinds: an
    ADVICE or CLEARING past the available balance and whatever the status, a REVERSAL
    always), against the oracle."""
    accounts = {a: Account(a, Decimal(b), c, s) for a, b, c, s in ACCOUNTS}
    cases = [(kind, account, currency, amount)
             for kind in ("PURCHASE", "REFUND", "AUTHORIZATION", "ADVICE", "REVERSAL",
                          "CLEARING")
             for account in [*accounts, "FN-UNKNOWN"]
             for currency in ("EUR", "JPY")
             for amount in ("1", "5000")]
    rows = stack.fetch(env.dsn, """
        SELECT payauth_decide(a.balance, a.status, a.currency, t.currency, t.kind, t.amount)
          FROM unnest($1::text[], $2::text[], $3::text[], $4::numeric[], $5::numeric[],
                      $6::text[], $7::text[]) WITH ORDINALITY
               AS t(kind, account, currency, amount, balance, status, acurrency, ord)
          CROSS JOIN LATERAL (SELECT t.balance, t.status, t.acurrency AS currency) a
         ORDER BY t.ord""",
        [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases],
        [Decimal(c[3]) for c in cases],
        [accounts[c[1]].balance if c[1] in accounts else None for c in cases],
        [accounts[c[1]].status if c[1] in accounts else None for c in cases],
        [accounts[c[1]].currency if c[1] in accounts else None for c in cases])
    for (kind, account, currency, amount), row in zip(cases, rows, strict=True):
        want = decide(_auth("R", account, amount, kind, currency) if kind != "REVERSAL" else
                      decode_authorization(encode(auth_message(
                          "R", account_id=account, amount=amount, currency=currency,
                          authorization_type=kind, original_transaction_id="H"))),
                      accounts.get(account))
        assert row[0] == (want.decline_reason or want.result), (kind, account, currency, amount)
