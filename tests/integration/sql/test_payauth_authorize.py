"""``payauth_authorize`` (sql/payauth_authorize.sql), the one statement that decides a batch:
it decides exactly as the test oracle (tests/support/oracle.py) says, writes nothing when a
claim is lost, and whichever route it chooses for a batch, the route gives the rows the loop
(``payauth_authorize_each``, which holds every rule) would give."""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from service.adapters.pg_columns import joined, split
from service.adapters.postgres import PostgresStore
from service.core.ports import ClaimLost
from service.domain.messages import Authorization, decode_authorization
from tests.support import stack
from tests.support.factory import auth_message, authorization, encode
from tests.support.oracle import Account, decide_in_order, decide_in_order_with_inputs

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


def test_the_edges_of_each_rule(env: stack.Env) -> None:
    # In offset order, each seeing what the ones before it left.
    edges = [
        (authorization("E1", "FN-D", "5.00"), ("APPROVED", None)),  # exactly the balance
        (authorization("E2", "FN-D", "0.01"), ("DECLINED", "INSUFFICIENT_FUNDS")),
        (authorization("E3", "FN-D", "1.00", "REFUND"), ("APPROVED", None)),
        (authorization("E4", "FN-D", "1.00"), ("APPROVED", None)),  # the refund, spent at once
        (authorization("E5", "FN-E", "0.01"), ("DECLINED", "INSUFFICIENT_FUNDS")),
        (authorization("E6", "FN-B", "1.00", "REFUND"), ("DECLINED", "ACCOUNT_BLOCKED")),
        (authorization("E7", "FN-C", "1.00", "REFUND"), ("DECLINED", "CURRENCY_MISMATCH")),
        (authorization("E8", "FN-NONE", "1.00", "REFUND"), ("DECLINED", "UNKNOWN_ACCOUNT")),
        (authorization("E9", "FN-C", "1000", currency="JPY"), ("APPROVED", None)),
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


def test_a_lost_claim_writes_nothing_of_its_message_and_decides_the_rest(
        env: stack.Env) -> None:
    """A key of the batch decided since the worker's lookup (here: before the call) is
    answered lost, nothing of it written again; the rest of the batch is decided as the
    batch without it would be, in its order, and committed."""
    async def scenario() -> tuple[list[Any], list[Authorization], list[Any],
                                  dict[str, Account], dict[str, Account]]:
        await _seed(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            first = _random_batch(random.Random(1), "first", 20)
            await store.authorize(first, source_topic="t", source_partitions=[0] * 20,
                                  source_offsets=list(range(20)))
            rest = _random_batch(random.Random(2), "second", 20)
            before = await _accounts(env.dsn)
            reference = decide_in_order(rest, before)
            second = [*rest[:10], first[5], *rest[10:]]
            stored = await store.authorize(second, source_topic="t",
                                           source_partitions=[1] * 21,
                                           source_offsets=list(range(21)))
        finally:
            await store.close()
        return stored, rest, reference, before, await _accounts(env.dsn)

    stored, rest, reference, before, after = asyncio.run(scenario())
    assert [s.transaction_id for s in stored] == [
        f"FN-second-{i}" for i in range(20)]
    assert [(s.result, s.decline_reason) for s in stored] == [
        (d.result, d.decline_reason) for d in reference]
    moved = {a: sum((d.delta for m, d in zip(rest, reference, strict=True)
                     if m.account_id == a), Decimal(0)) for a in before}
    assert {a: after[a].balance for a in after} == {
        a: before[a].balance + moved[a] for a in before}
    [record] = stack.fetch(env.dsn, "SELECT source_partition FROM processed_transactions "
                                    "WHERE txn_id = 'FN-first-5'")
    [entries] = stack.fetch(env.dsn, "SELECT count(*) AS n FROM ledger_entries "
                                     "WHERE txn_id = 'FN-first-5'")
    assert record["source_partition"] == 0 and entries["n"] <= 1


@pytest.mark.parametrize("kind", ["PURCHASE", "AUTHORIZATION"])
def test_an_orphan_kept_in_another_currency_than_its_account_is_void(env: stack.Env,
                                                                     kind: str) -> None:
    """A reversal of 10.00 USD for an account not opened yet is kept in USD; the account is
    then opened in EUR and its original, 10.00 EUR, approved: the orphan is void (nothing
    credited or released in EUR for a USD amount), as for an orphan of another account."""
    run = uuid.uuid4().hex[:6]
    account = f"FN-LATE-{run}"

    async def scenario() -> list[Any]:
        store = await PostgresStore.connect(env.dsn)
        try:
            [kept] = await stack.authorize_in_order(store, [authorization(
                f"R-{run}", account, "10.00", "REVERSAL", currency="USD",
                original=f"O-{run}")])
            assert kept.orphan
            await stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")])
            return await stack.authorize_in_order(store, [
                authorization(f"O-{run}", account, "10.00", kind)])
        finally:
            await store.close()

    [decided] = asyncio.run(scenario())
    assert decided.result.value == "APPROVED"
    [orphan] = stack.fetch(env.dsn, "SELECT state, applied FROM orphan_reversals "
                                    "WHERE txn_id = $1", f"R-{run}")
    assert (orphan["state"], orphan["applied"]) == ("VOID", Decimal("0"))
    [row] = stack.fetch(env.dsn, "SELECT balance - held AS available FROM accounts "
                                 "WHERE account_id = $1", account)
    assert row["available"] == Decimal("90.00")


# A key of the batch already in another table a route writes by transaction_id (its dedup
# record purged, or another replica's write the lookup missed): the route's INSERT violates
# it. Where the worker's lookup finds a decision (the ledger, the lifecycle's messages) the
# key is answered lost and the rest decided; where it cannot (a hold alone), the whole
# statement is refused, PA409, and nothing is written.
_WRITTEN_FIRST = {
    "ledger_entries": ("PURCHASE", "INSERT INTO ledger_entries (txn_id, account_id, amount, "
                                   "currency, type, created_at) "
                                   "VALUES ($1, 'FN-A', -1, 'EUR', 'PURCHASE', now())", True),
    "lifecycle_messages": ("AUTHORIZATION",
                           "INSERT INTO lifecycle_messages (txn_id, kind, account_id, amount, "
                           "currency, fingerprint, result, processed_at) VALUES "
                           "($1, 'AUTHORIZATION', 'FN-A', 1, 'EUR', 'fp', 'APPROVED', now())",
                           True),
    "holds": ("AUTHORIZATION", "INSERT INTO holds (txn_id, account_id, currency, kind, amount, "
                               "remaining, state) VALUES ($1, 'FN-A', 'EUR', 'AUTHORIZATION', "
                               "1, 1, 'ACTIVE')", False),
}


@pytest.mark.parametrize("table", sorted(_WRITTEN_FIRST))
def test_a_key_written_first_in_any_table_of_a_route_loses_the_claim(env: stack.Env,
                                                                      table: str) -> None:
    kind, insert, named = _WRITTEN_FIRST[table]
    txn = f"FN-first-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[dict[str, Account], dict[str, Account], list[str]]:
        await _seed(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute(insert, txn)
        finally:
            await conn.close()
        before = await _accounts(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        batch = [authorization(f"{txn}-other", "FN-A", "1.00"),
                 authorization(txn, "FN-A", "2.00", kind)]
        try:
            if named:
                decided = await store.authorize(batch, source_topic="t",
                                                source_partitions=[0, 0],
                                                source_offsets=[0, 1])
            else:
                decided = []
                with pytest.raises(ClaimLost) as lost:
                    await store.authorize(batch, source_topic="t", source_partitions=[0, 0],
                                          source_offsets=[0, 1])
                assert getattr(lost.value.__cause__, "sqlstate", None) == "PA409"  # the SQL's
        finally:
            await store.close()
        return before, await _accounts(env.dsn), [d.transaction_id for d in decided]

    before, after, decided = asyncio.run(scenario())
    claimed = [r["txn_id"] for r in stack.fetch(
        env.dsn, "SELECT txn_id FROM processed_transactions WHERE txn_id LIKE $1 "
                 "ORDER BY txn_id", f"{txn}%")]
    if named:
        assert decided == claimed == [f"{txn}-other"]
        assert after["FN-A"].balance == before["FN-A"].balance - Decimal("1.00")
    else:
        assert decided == claimed == [] and after == before


def test_a_key_of_another_table_violated_is_raised_as_it_is(env: stack.Env) -> None:
    """Only the keys of what a route claims or writes by transaction_id are a lost claim: a
    fault elsewhere (here a unique index on the accounts' update time, which a batch moving
    two accounts at once violates) comes out of the statement as it is: not PA409."""
    async def scenario() -> None:
        await _seed(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("UPDATE accounts a SET updated_at = 'epoch'::timestamptz "
                               "+ n.n * interval '1 s' FROM (SELECT account_id, row_number() "
                               "OVER () AS n FROM accounts) n WHERE n.account_id = a.account_id")
            await conn.execute("CREATE UNIQUE INDEX fn_one_update_time ON accounts (updated_at)")
            try:
                store = await PostgresStore.connect(env.dsn)
                try:
                    with pytest.raises(ClaimLost) as lost:  # (the adapter's safety net)
                        await store.authorize([authorization("FN-x-1", "FN-A", "1.00"),
                                               authorization("FN-x-2", "FN-D", "1.00")],
                                              source_topic="t", source_partitions=[0, 0],
                                              source_offsets=[0, 1])
                    cause = lost.value.__cause__
                    assert isinstance(cause, asyncpg.UniqueViolationError), cause
                    assert cause.constraint_name == "fn_one_update_time"
                finally:
                    await store.close()
            finally:
                await conn.execute("DROP INDEX fn_one_update_time")
        finally:
            await conn.close()

    asyncio.run(scenario())


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
    """A batch holding any lifecycle kind takes a lifecycle route whole: its purchases and
    refunds are decided, recorded and posted exactly as the purchases route decides them (the
    same random batches as above, each with an ADVICE on an account of its own)."""
    async def scenario() -> None:
        await _seed(env.dsn)
        await stack.seed_accounts(env.dsn, [("FN-HOLDS", "0.00", "EUR")])
        store = await PostgresStore.connect(env.dsn)
        rng = random.Random(7)
        try:
            for round_number in range(4):
                batch = _random_batch(rng, f"lc{round_number}", 150)
                advice = authorization(f"FN-lc{round_number}-advice", "FN-HOLDS", "1.00", "ADVICE")
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


# ---------------------------------------------------------------- the routes agree

CALL = """SELECT * FROM {fn}($1::text[], $2::text[], $3::numeric[], $4::text[], $5::text[],
                            $6::text[], $7::text[], $8::text[], $9::integer[], $10::bigint[],
                            $11, $12, $13, $14::text[], $15::numeric[], $16::text[],
                            $17::boolean[], $18::boolean[], $19::text[], $20::text[],
                            $21::text[], $22::text[], $23)"""
# Each route's calls as counted so far in the transaction (track_functions).
ROUTE_CALLS = ("SELECT funcname, calls FROM pg_stat_xact_user_functions "
               "WHERE funcname IN ('payauth_authorize_purchases', 'payauth_authorize_lifecycle', "
               "'payauth_authorize_each')")
# What each path wrote, without what differs between two transactions by nature (serial ids,
# the database's clock): compared row for row.
SNAPSHOT = {
    "holds": "SELECT txn_id, account_id, kind, amount, incremented, remaining, state, limited, "
             "ended_at IS NULL AS active, ended_by, released FROM holds ORDER BY txn_id",
    "processed": "SELECT txn_id, result, decline_reason, amount_applied, forced, orphan, "
                 "original_txn_id, input_balance, input_status, input_currency, rule_version, "
                 "billing_amount, billing_currency, partial_ok, amount_approved, final, "
                 "input_hold_state, ledger_balance, already_cleared, message_time, card_id, "
                 "merchant_category, merchant_country, input_card_status, input_card_expires, "
                 "input_blocks, input_limits::text, input_limit_reads::text, limit_id "
                 "FROM processed_transactions ORDER BY txn_id",
    "usage": "SELECT limit_id, period_start, amount, count FROM limit_usage "
             "ORDER BY limit_id, period_start",
    "charges": "SELECT txn_id, charged_by, limit_id, period_start, amount, count "
               "FROM limit_charges ORDER BY txn_id, limit_id, charged_by",
    "lifecycle": "SELECT txn_id, kind, result, decline_reason, amount_applied, forced, orphan, "
                 "ended_hold, original_txn_id, final, amount_approved "
                 "FROM lifecycle_messages ORDER BY txn_id",
    "ledger": "SELECT txn_id, account_id, amount, currency, type, request_fingerprint "
              "FROM ledger_entries ORDER BY txn_id",
    "orphans": "SELECT txn_id, state, applied FROM orphan_reversals ORDER BY txn_id",
    "early": "SELECT txn_id, state, applied FROM early_clearings ORDER BY txn_id",
    "accounts": "SELECT account_id, balance, held FROM accounts ORDER BY account_id",
}


@dataclass(frozen=True)
class Msg:
    txn: str
    account: str
    kind: str
    amount: str
    original: str | None = None
    currency: str = "EUR"
    billing: tuple[str, str] | None = None  # (amount, currency)
    partial: bool = False
    final: bool | None = None
    card: str | None = None
    category: str = "5411"
    country: str | None = None
    time: datetime = datetime(2026, 12, 1, 12, tzinfo=UTC)


PATH_ACCOUNTS = [("P-RICH", "100000.00", "ACTIVE"), ("P-POOR", "50.00", "ACTIVE"),
                 ("P-BLOCKED", "1000.00", "BLOCKED")]


class Stream:
    """Random batches whose every REVERSAL, CLEARING and INCREMENTAL names a hold placed
    before it (the common path), with the decisions that path must still make: declines
    for funds and status, capped and full reversals, a reversal, clearing or increment
    after the hold's end, clearings over and under the hold, non-final ones and forced
    ones, advices past the balance, increments, partial approvals, conversions,
    verifications and balance inquiries."""

    def __init__(self, seed: int, accounts: list[tuple[str, str, str]] = PATH_ACCOUNTS,
                 cards: dict[str, list[str | None]] | None = None) -> None:
        self.rng = random.Random(seed)
        self.holds: dict[str, str] = {}  # placed (approved for sure) -> its account
        self.n = 0
        self.accounts = accounts
        self.cards = cards  # per account, the cards its messages name (None: no card)
        self.prefix = accounts[0][0][:2]

    def _txn(self) -> str:
        self.n += 1
        return f"{self.prefix}{self.n:05d}"

    def message(self) -> Msg:
        msg = self._message()
        if self.cards is None:
            return msg
        # The controls: a card of the account, of another or of nobody; a blocked category
        # or country now and then; a time on either side of midnight in Madrid (the
        # limits' zone in _args), so that a DAY limit counts in two periods.
        rng = self.rng
        return replace(msg, card=rng.choice(self.cards.get(msg.account, [None])),
                       category=rng.choice(["5411", "5411", "5411", "7995"]),
                       country=rng.choice([None, "ES", "ES", "ES", "KP"]),
                       time=rng.choice([datetime(2026, 12, 1, 22, 59, 59, tzinfo=UTC),
                                        datetime(2026, 12, 1, 23, 0, 1, tzinfo=UTC)]))

    def _message(self) -> Msg:
        rng = self.rng
        roll = rng.random()
        txn = self._txn()
        if self.holds and roll < 0.45:
            original = rng.choice(sorted(self.holds))
            account = self.holds[original]
            pick = rng.random()
            if pick < 0.45:
                return Msg(txn, account, "REVERSAL", rng.choice(["5.00", "20.00", "90.00"]),
                           original)
            if pick < 0.6:
                return Msg(txn, account, "INCREMENTAL", rng.choice(["10.00", "900.00"]),
                           original)
            if pick < 0.7:  # converted: the billing amount moves
                return Msg(txn, account, "CLEARING", "1500", original, "JPY",
                           billing=("9.50", "EUR"), final=rng.random() < 0.5)
            return Msg(txn, account, "CLEARING", rng.choice(["10.00", "60.00"]), original,
                       final=rng.choice([None, False, True]))
        account = rng.choice(self.accounts)[0]
        if roll < 0.62:
            kind = "ADVICE" if rng.random() < 0.3 or account != self.accounts[0][0] \
                else "AUTHORIZATION"
            self.holds[txn] = account  # an advice is always placed; so is a hold on P-RICH
            return Msg(txn, account, kind, rng.choice(["30.00", "70.00", "400.00"]))
        if roll < 0.67:
            return Msg(txn, account, "AUTHORIZATION", "5000.00",  # declined but on P-RICH
                       partial=rng.random() < 0.5)
        if roll < 0.72:
            return Msg(txn, account, "CLEARING", "15.00")  # forced
        if roll < 0.78:  # declined: an unknown account, another currency
            kind = rng.choice(["PURCHASE", "REFUND", "AUTHORIZATION", "VERIFICATION"])
            return Msg(txn, rng.choice(["P-NOBODY", account]), kind,
                       "0" if kind == "VERIFICATION" else "5.00", currency="USD")
        if roll < 0.84:
            return Msg(txn, account, rng.choice(["VERIFICATION", "BALANCE_INQUIRY"]), "0.00",
                       currency=rng.choice(["EUR", "EUR", "USD"]))
        if roll < 0.9:  # abroad
            return Msg(txn, account, rng.choice(["PURCHASE", "AUTHORIZATION"]), "100.00",
                       currency="USD", billing=(rng.choice(["91.50", "9000.00"]), "EUR"),
                       partial=rng.random() < 0.5)
        return Msg(txn, account, rng.choice(["PURCHASE", "REFUND"]),
                   rng.choice(["25.00", "800.00"]),
                   partial=rng.random() < 0.4)


def _args(batch: list[Msg]) -> list[Any]:
    n = len(batch)
    return [[b.txn for b in batch], [b.account for b in batch],
            [Decimal(b.amount) for b in batch], [b.currency for b in batch],
            [b.kind for b in batch], [f"fp-{b.txn}" for b in batch],
            [f"c-{b.txn}" for b in batch], [f"m-{b.txn}" for b in batch], [0] * n,
            list(range(n)), datetime(2026, 12, 1, tzinfo=UTC), "t", uuid.uuid4(),
            [b.original for b in batch],
            [Decimal(b.billing[0]) if b.billing else None for b in batch],
            [b.billing[1] if b.billing else None for b in batch],
            [b.partial and b.kind in ("PURCHASE", "AUTHORIZATION") for b in batch],
            [b.final for b in batch], [b.card for b in batch], [b.category for b in batch],
            [b.country for b in batch], [b.time.isoformat() for b in batch], "Europe/Madrid"]


async def _routes(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["funcname"]: r["calls"] for r in await conn.fetch(ROUTE_CALLS)}


async def _decide(conn: asyncpg.Connection, fn: str, args: list[Any]
                  ) -> tuple[list[tuple[Any, ...]], dict[str, list[tuple[Any, ...]]], str]:
    """``fn`` on ``args`` inside a transaction the caller ends: its answer, the tables after
    it, and the route the batch took (for payauth_authorize)."""
    before = await _routes(conn)
    rows = await conn.fetch(CALL.format(fn=fn), *args)
    after = await _routes(conn)
    taken = [name for name, calls in after.items() if calls > before.get(name, 0)]
    tables = {name: [tuple(r) for r in await conn.fetch(sql)] for name, sql in SNAPSHOT.items()}
    # (the columns both answer: not payauth_authorize's claim_lost, never set without a race)
    return [tuple(r)[:14] + tuple(r)[17:19] for r in rows], tables, ",".join(sorted(taken))


async def _both(conn: asyncpg.Connection, batch: list[Msg]) -> str:
    """Decides ``batch`` by the loop alone and by payauth_authorize, asserts they agree,
    keeps payauth_authorize's effects; returns the route it took."""
    args = _args(batch)
    tx = conn.transaction()
    await tx.start()
    by_loop = await _decide(conn, "payauth_authorize_each", args)
    await tx.rollback()
    tx = conn.transaction()
    await tx.start()
    routed = await _decide(conn, "payauth_authorize", args)
    await tx.commit()
    # The purchases route leaves the deltas to the events (NULL): they follow from each
    # message's kind and what was approved (which it answers only when it is not the
    # amount as sent).
    # (Nor does it say "not partial" in words: NULL, false for the worker.)
    purchases = routed[2] == "payauth_authorize_purchases"
    assert [(*r[:6], bool(r[9]), *r[10:]) if purchases else r for r in routed[0]] == \
        [(*r[:6], bool(r[9]), *r[10:]) if purchases else r for r in by_loop[0]], batch
    assert routed[1] == by_loop[1], batch
    return routed[2]


def test_each_route_decides_as_the_loop(env: stack.Env) -> None:
    async def scenario() -> None:
        for account, balance, status in PATH_ACCOUNTS:
            await stack.seed_accounts(env.dsn, [(account, balance, "EUR")], status=status)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET track_functions = 'pl'")
            stream = Stream(seed=12)
            routes: set[str] = set()
            results: set[tuple[Any, ...]] = set()
            for size in [1, 3, 20, 60, 150] * 3:
                batch = [stream.message() for _ in range(size)]
                routes.add(await _both(conn, batch))
                results |= {(r["result"], r["decline_reason"]) for r in await conn.fetch(
                    "SELECT result, decline_reason FROM processed_transactions")}
            # Every batch of the common path took a set-based route.
            assert routes <= {"payauth_authorize_lifecycle", "payauth_authorize_purchases"}
            assert {("APPROVED", None), ("DECLINED", "INSUFFICIENT_FUNDS"),
                    ("DECLINED", "ACCOUNT_BLOCKED"), ("DECLINED", "UNKNOWN_ACCOUNT"),
                    ("DECLINED", "CURRENCY_MISMATCH"), ("DECLINED", "HOLD_NOT_ACTIVE")} \
                <= results
            day = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE amount_approved < amount) AS partial, "
                "count(*) FILTER (WHERE billing_currency IS NOT NULL AND result = 'APPROVED') "
                "AS converted, count(*) FILTER (WHERE ledger_balance IS NOT NULL) AS inquiries, "
                "count(*) FILTER (WHERE final = false) AS split "
                "FROM processed_transactions")
            assert all(day[k] > 0 for k in ("partial", "converted", "inquiries", "split")), day
            assert await conn.fetchval("SELECT count(*) FROM holds WHERE incremented > 0") > 0
            states = {r["state"] for r in await conn.fetch("SELECT state FROM holds")}
            assert {"ACTIVE", "REVERSED", "CLEARED"} <= states

            # A hold declined earlier in its batch, then reversed and cleared in it: the
            # lifecycle route (the reversal changes nothing, the clearing is forced).
            declined_in_batch = [
                Msg("P-D1", "P-POOR", "AUTHORIZATION", "5000.00"),
                Msg("P-D2", "P-POOR", "REVERSAL", "10.00", "P-D1"),
                Msg("P-D3", "P-POOR", "CLEARING", "10.00", "P-D1"),
                Msg("P-D4", "P-POOR", "INCREMENTAL", "10.00", "P-D1"),
            ]
            assert await _both(conn, declined_in_batch) == "payauth_authorize_lifecycle"

            # Off the common path: the loop, whole.
            off_path = [
                [Msg("P-X1", "P-RICH", "REVERSAL", "5.00", "P-NOT-YET")],  # an orphan
                [Msg("P-X2", "P-NOBODY", "CLEARING", "5.00")],  # no account
                [Msg("P-X5", "P-RICH", "ADVICE", "5.00", currency="USD")],  # no billing
                [Msg("P-X3", "P-RICH", "AUTHORIZATION", "1.00"),
                 Msg("P-X4", "P-POOR", "REVERSAL", "1.00", "P-X3")],  # another's hold
                [Msg("P-X6", "P-RICH", "REVERSAL", "1.00", "P-X7"),  # before its hold
                 Msg("P-X7", "P-RICH", "AUTHORIZATION", "1.00")],
                [Msg("P-X8", "P-RICH", "PURCHASE", "1.00"),
                 Msg("P-X9", "P-RICH", "REVERSAL", "1.00", "P-X8")],  # of a purchase
                [Msg("P-Y1", "P-RICH", "PURCHASE", "2.00")],  # P-X6 never came...
                [Msg("P-X6B", "P-RICH", "REVERSAL", "1.00", "P-Y2")],
                [Msg("P-Y2", "P-RICH", "PURCHASE", "2.00")],  # ...an orphan waits
                [Msg("P-Z1", "P-RICH", "CLEARING", "3.00", "P-Z2", final=False)],  # early
                [Msg("P-Z2", "P-RICH", "AUTHORIZATION", "10.00")],  # its hold comes
                [Msg("P-Z3", "P-RICH", "INCREMENTAL", "3.00", "P-NO-HOLD")],  # no hold
            ]
            for batch in off_path:
                route = await _both(conn, batch)
                want = "payauth_authorize_purchases" if batch[0].txn == "P-Y1" \
                    else "payauth_authorize_each"
                assert route == want, batch
            # A hold found (placed by a batch before), named by a message of another
            # account, beside a message the lifecycle route decides: the batch split, the
            # loop for the account that names it.
            await stack.seed_accounts(env.dsn, [("P-W-ONE", "100.00", "EUR"),
                                                ("P-W-TWO", "100.00", "EUR")])
            assert await _both(conn, [Msg("P-W1", "P-W-ONE", "AUTHORIZATION", "1.00")]) \
                == "payauth_authorize_lifecycle"
            assert await _both(conn, [Msg("P-W2", "P-W-ONE", "AUTHORIZATION", "1.00"),
                                      Msg("P-W3", "P-W-TWO", "CLEARING", "1.00", "P-W1")]) \
                == SPLIT
        finally:
            await conn.close()

    asyncio.run(scenario())


SPLIT = "payauth_authorize_each,payauth_authorize_lifecycle"  # both, in one statement
MIXED_ACCOUNTS = [(f"M-{i}", "100000.00" if i else "60.00", "ACTIVE") for i in range(6)]


class MixedStream(Stream):
    """The common path's random batches with messages off it among them, on six accounts:
    orphan reversals and clearings before their holds (their originals sent later, on
    their account or another), reversals of purchases, originals of another account,
    increments of no hold, clearings of no account."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed, MIXED_ACCOUNTS)
        self.promised: list[tuple[str, str, str]] = []  # (txn, account, kind) named already
        self.purchases: dict[str, str] = {}

    def _message(self) -> Msg:
        rng = self.rng
        roll = rng.random()
        if self.promised and roll < 0.05:  # an original named before it came
            txn, account, kind = self.promised.pop(rng.randrange(len(self.promised)))
            if rng.random() < 0.2:  # ... on another account
                account = rng.choice(self.accounts)[0]
            if kind == "AUTHORIZATION":
                self.holds[txn] = account
            return Msg(txn, account, kind, rng.choice(["30.00", "70.00"]))
        if roll < 0.09:
            account = rng.choice(self.accounts)[0]
            original = f"{self._txn()}-LATER"
            kind = rng.choice(["PURCHASE", "AUTHORIZATION"])
            self.promised.append((original, account, kind))
            if kind == "AUTHORIZATION" and rng.random() < 0.5:
                return Msg(self._txn(), account, "CLEARING", "10.00", original,
                           final=rng.choice([False, True]))
            return Msg(self._txn(), account, "REVERSAL", "10.00", original)
        if roll < 0.11 and self.purchases:
            original = rng.choice(sorted(self.purchases))
            return Msg(self._txn(), self.purchases[original], "REVERSAL", "5.00", original)
        if roll < 0.12 and self.holds:  # a hold of another account, most likely
            return Msg(self._txn(), rng.choice(self.accounts)[0], "REVERSAL", "1.00",
                       rng.choice(sorted(self.holds)))
        if roll < 0.13:
            return Msg(self._txn(), rng.choice(self.accounts)[0], "INCREMENTAL", "1.00",
                       "NO-SUCH-HOLD")
        if roll < 0.14:
            return Msg(self._txn(), "M-NOBODY", "CLEARING", "1.00")
        msg = super()._message()
        if msg.kind == "PURCHASE":
            self.purchases[msg.txn] = msg.account
        return msg


def test_a_batch_with_messages_off_the_path_is_split_by_account(env: stack.Env) -> None:
    """Random batches of the common path on six accounts, with messages among them that
    only the loop decides: the batch is split (the loop for those messages' accounts, the
    lifecycle route for the others, in one statement) and decides as the loop decides the
    whole batch, row for row and table for table."""
    async def scenario() -> set[str]:
        for account, balance, status in MIXED_ACCOUNTS:
            await stack.seed_accounts(env.dsn, [(account, balance, "EUR")], status=status)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET track_functions = 'pl'")
            # An original of the batch named first by another account's reversal (the loop:
            # an orphan, voided by its original after it; never a mismatch): both accounts
            # to the loop, the third to the lifecycle route.
            assert await _both(conn, [Msg("M-T1", "M-1", "REVERSAL", "1.00", "M-T2"),
                                      Msg("M-T2", "M-2", "AUTHORIZATION", "5.00"),
                                      Msg("M-T3", "M-3", "AUTHORIZATION", "5.00")]) == SPLIT
            # Two accounts off the lifecycle route, found in one pass: both to the loop.
            assert await _both(conn, [Msg("M-T4", "M-NOBODY", "CLEARING", "1.00"),
                                      Msg("M-T5", "M-1", "INCREMENTAL", "1.00", "NO-HOLD"),
                                      Msg("M-T6", "M-2", "AUTHORIZATION", "5.00"),
                                      Msg("M-T7", "M-1", "AUTHORIZATION", "5.00")]) == SPLIT
            stream = MixedStream(seed=7)
            return {await _both(conn, [stream.message() for _ in range(size)])
                    for size in [5, 20, 60, 150] * 4}
        finally:
            await conn.close()

    routes = asyncio.run(scenario())
    assert SPLIT in routes, routes


CONTROLS_ACCOUNTS = [("Q-RICH", "100000.00", "ACTIVE"), ("Q-POOR", "50.00", "ACTIVE"),
                     ("Q-BLOCKED", "1000.00", "BLOCKED"), ("Q-MORE1", "100000.00", "ACTIVE"),
                     ("Q-MORE2", "100000.00", "ACTIVE"), ("Q-MORE3", "100000.00", "ACTIVE")]
CONTROLS = """
INSERT INTO cards (card_id, account_id, status, expires_on) VALUES
    ('Q-C-OK', 'Q-RICH', 'ACTIVE', '2027-12-31'), ('Q-C-FROZEN', 'Q-RICH', 'FROZEN', NULL),
    ('Q-C-EXP', 'Q-RICH', 'ACTIVE', '2026-12-01'), ('Q-C-POOR', 'Q-POOR', 'ACTIVE', NULL),
    ('Q-C-M1', 'Q-MORE1', 'ACTIVE', NULL), ('Q-C-M2', 'Q-MORE2', 'ACTIVE', NULL);
INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount, max_count,
                             merchant_category) VALUES
    ('L-CARD-DAY', 'CARD', 'Q-C-OK', 'DAY', 900, 12, NULL),
    ('L-RICH-MONTH', 'ACCOUNT', 'Q-RICH', 'MONTH', 2500, NULL, NULL),
    ('L-RICH-GAMBLING', 'ACCOUNT', 'Q-RICH', 'DAY', NULL, 2, '7995'),
    ('L-POOR-EACH', 'ACCOUNT', 'Q-POOR', 'TRANSACTION', 45, NULL, NULL),
    ('L-POOR-WEEK', 'CARD', 'Q-C-POOR', 'WEEK', NULL, 6, NULL),
    ('L-M1-DAY', 'CARD', 'Q-C-M1', 'DAY', 500, NULL, NULL),
    ('L-M2-DAY', 'CARD', 'Q-C-M2', 'DAY', NULL, 3, NULL),
    ('L-M3-MONTH', 'ACCOUNT', 'Q-MORE3', 'MONTH', 700, NULL, NULL);
INSERT INTO card_blocks (scope, scope_id, kind, value) VALUES
    ('ACCOUNT', 'Q-RICH', 'COUNTRY', 'KP'), ('CARD', 'Q-C-POOR', 'CATEGORY', '7995');
"""


def test_each_route_judges_the_card_controls_as_the_loop(env: stack.Env) -> None:
    """Random batches on cards frozen, expired, of another account or of nobody, with
    blocked categories and countries, and limits by card and by account, per transaction,
    day (two days: the messages' own times either side of midnight in the limits' zone),
    week and month, one by category: every route decides, counts and gives back as the
    loop does, row for row, usage and charges included; the usage never passes a limit and
    always equals what the charges kept."""
    async def scenario() -> None:
        for account, balance, status in CONTROLS_ACCOUNTS:
            await stack.seed_accounts(env.dsn, [(account, balance, "EUR")], status=status)
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute(CONTROLS)
            await conn.execute("SET track_functions = 'pl'")
            stream = Stream(seed=39, accounts=CONTROLS_ACCOUNTS, cards={
                "Q-RICH": [None, "Q-C-OK", "Q-C-OK", "Q-C-OK", "Q-C-FROZEN", "Q-C-EXP",
                           "Q-C-POOR", "Q-C-NOBODY"],
                "Q-POOR": [None, "Q-C-POOR", "Q-C-POOR"], "Q-MORE1": [None, "Q-C-M1"],
                "Q-MORE2": ["Q-C-M2"]})
            routes: set[str] = set()
            for size in (1, 40, 150):  # the purchases route's kinds alone, first
                batch = [m for m in (stream.message() for _ in range(size * 4))
                         if m.kind in ("PURCHASE", "REFUND", "VERIFICATION",
                                       "BALANCE_INQUIRY")][:size]
                routes.add(await _both(conn, batch))
            stream.holds.clear()  # (those it made were never sent)
            for size in [1, 3, 20, 60, 150] * 3:
                batch = [stream.message() for _ in range(size)]
                routes.add(await _both(conn, batch))
            assert {"payauth_authorize_lifecycle", "payauth_authorize_purchases"} <= routes
            reasons = {r["decline_reason"] for r in await conn.fetch(
                "SELECT DISTINCT decline_reason FROM processed_transactions")}
            assert {"UNKNOWN_CARD", "CARD_BLOCKED", "CARD_EXPIRED", "CATEGORY_BLOCKED",
                    "COUNTRY_BLOCKED", "LIMIT_EXCEEDED"} <= reasons
            limited = {r["limit_id"] for r in await conn.fetch(
                "SELECT DISTINCT limit_id FROM processed_transactions "
                "WHERE limit_id IS NOT NULL")}
            # Per transaction, day, week and month; by amount and by count.
            assert {"L-CARD-DAY", "L-POOR-EACH", "L-POOR-WEEK", "L-M2-DAY", "L-M3-MONTH"} \
                <= limited, limited
            # Two days of the card's DAY limit, counted; given back by reversals.
            assert await conn.fetchval("SELECT count(DISTINCT period_start) FROM limit_usage "
                                       "WHERE limit_id = 'L-CARD-DAY'") == 2
            assert await conn.fetchval("SELECT count(*) FROM limit_charges "
                                       "WHERE count = 0 AND amount = 0") > 0
            over = await conn.fetch(
                "SELECT u.* FROM limit_usage u JOIN spending_limits l USING (limit_id) "
                "WHERE u.amount > l.max_amount OR u.count > l.max_count")
            # (An ADVICE is counted past a limit: none of these limits counts one past it
            # unless an advice did; then the usage may pass it, as the contract says.)
            advices_past = await conn.fetchval(
                "SELECT count(*) FROM processed_transactions WHERE authorization_type = "
                "'ADVICE' AND input_limit_reads IS NOT NULL")
            assert not over or advices_past, over
            mismatched = await conn.fetch(
                "SELECT u.limit_id, u.period_start FROM limit_usage u "
                "FULL JOIN (SELECT limit_id, period_start, sum(amount) AS amount, "
                "                  sum(count) AS count FROM limit_charges "
                "            GROUP BY limit_id, period_start) c USING (limit_id, period_start) "
                "WHERE u.amount IS DISTINCT FROM c.amount OR u.count IS DISTINCT FROM c.count")
            assert not mismatched, mismatched
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_a_hold_counted_only_within_the_batch_gives_back_as_the_loop(env: stack.Env) -> None:
    """A hold placed before any limit (nothing of it counted), then a limit: a batch that
    increments it (counted), reverses it in full and then makes a purchase the limit only
    fits once the increment is given back; and a batch that reverses a hold in part, then
    increments it. Each route gives back what the loop does, when the loop does (seen
    failing with the give-back read from the hold as the batch leaves it, and with the first
    batch on the set-based route)."""
    async def scenario() -> None:
        await stack.seed_accounts(env.dsn, [("R-ACC", "10000.00", "EUR")])
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET track_functions = 'pl'")
            await _both(conn, [Msg("R-H1", "R-ACC", "AUTHORIZATION", "100.00"),
                               Msg("R-H2", "R-ACC", "AUTHORIZATION", "100.00")])
            await conn.execute(
                "INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount) "
                "VALUES ('R-DAY', 'ACCOUNT', 'R-ACC', 'DAY', 100)")
            await _both(conn, [Msg("R-I1", "R-ACC", "INCREMENTAL", "50.00", "R-H1"),
                               Msg("R-V1", "R-ACC", "REVERSAL", "150.00", "R-H1"),
                               Msg("R-P1", "R-ACC", "PURCHASE", "80.00")])
            await _both(conn, [Msg("R-V2", "R-ACC", "REVERSAL", "30.00", "R-H2"),
                               Msg("R-I2", "R-ACC", "INCREMENTAL", "20.00", "R-H2")])
            decided = {r["txn_id"]: r["result"] for r in await conn.fetch(
                "SELECT txn_id, result FROM processed_transactions")}
            assert decided["R-P1"] == "APPROVED"  # the increment's 50 given back first
            assert await conn.fetchval("SELECT amount FROM limit_usage") == Decimal("100.00")
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_a_forced_clearing_first_on_a_new_connection(env: stack.Env) -> None:
    """The loop's first message names no original, so it has read no hold yet, and the
    connection has never planned the loop's expressions: a clearing's test of its hold must
    not read the unread one (PL/pgSQL plans an expression with every variable it names)."""
    async def scenario() -> None:
        await stack.seed_accounts(env.dsn, [("P-RICH", "100.00", "EUR")])
        conn = await asyncpg.connect(env.dsn)
        try:
            async with conn.transaction():
                rows = await conn.fetch(CALL.format(fn="payauth_authorize"), *_args([
                    Msg("P-W1", "P-RICH", "CLEARING", "2.00"),  # forced
                    Msg("P-W2", "P-RICH", "REVERSAL", "1.00", "P-NOT-YET")]))  # an orphan
            assert [(r["result"], r["forced"], r["orphan"]) for r in rows] == [
                ("APPROVED", True, None), ("APPROVED", None, True)]
            assert await conn.fetchval(
                "SELECT balance FROM accounts WHERE account_id = 'P-RICH'") == Decimal("98.00")
        finally:
            await conn.close()

    asyncio.run(scenario())
