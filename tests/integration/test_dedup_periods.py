"""The dedup store partitioned by period (migrations/018_dedup_store_by_period.sql): each
rule across a period's end, with the store's clock (``payauth_dedup_clock``) set in the
test's own database. A duplicate and a conflict whose record is in the period before,
through the broker; two replicas claiming one transaction_id at once on either side of
the end, and a claim that straddles it (sql/payauth_claim_period.sql); the partitions made
ahead, and a record made before them moved into its own; the purge dropping whole periods
and deleting only what an administrator set back, beside a vacuum of a period, and giving
up a period whose record is set within the window meanwhile; a detach of the limits'
charges waiting for a verify under way and for the detached charges' sum and drop; the
upgrade from the table of before."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from service.adapters import retention
from service.adapters.postgres import PostgresStore
from service.core.ports import TransientError
from service.domain.messages import Authorization, decode_authorization
from service.ops import verify as verify_module
from service.ops.migrate import migrate
from service.ops.verify import Check, report, verify
from tests.support import stack
from tests.support.factory import auth_message, authorization, encode
from tests.support.held_open import HeldOpenStore, command_while_a_batch_decides
from tests.support.workers import wait_until

TODAY = datetime.now(UTC).date()
T = TypeVar("T")
FENCE = 1885436260 << 32  # payauth_claim_period's locks: this, plus a period's epoch second

# What a VACUUM (autovacuum's too) holds on the table it works through: SHARE UPDATE
# EXCLUSIVE, which conflicts with a detach's or an attach's ACCESS EXCLUSIVE but not with a
# claim's locks.
_AS_A_VACUUM_DOES = "LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE"

# The day before the server's (UTC): the period an upgrade keeps the records of before in.
_THE_DAY_BEFORE = "SELECT date_trunc('day', now(), 'UTC') - interval '1 day'"


def _stop_the_clock(dsn: str) -> None:
    """The store's clock read from a table of this database (NULL: the server's)."""
    for statement in (
            "CREATE TABLE test_clock (at timestamptz)",
            "INSERT INTO test_clock VALUES (NULL)",
            "GRANT SELECT ON test_clock TO payauth_worker",
            "CREATE OR REPLACE FUNCTION payauth_dedup_clock() RETURNS timestamptz "
            "LANGUAGE sql VOLATILE "
            "AS $$ SELECT coalesce((SELECT at FROM test_clock), clock_timestamp()) $$"):
        stack.fetch(dsn, statement)


def _set_clock(dsn: str, at: datetime | None) -> None:
    stack.fetch(dsn, "UPDATE test_clock SET at = $1", at)


async def _clock_to(dsn: str, at: datetime) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE test_clock SET at = $1", at)
    finally:
        await conn.close()


def _at(day_offset: int, hh: int, mm: int, ss: int, micro: int = 0) -> datetime:
    return datetime.combine(TODAY + timedelta(days=day_offset), time(hh, mm, ss, micro),
                            tzinfo=UTC)


def _day(offset: int) -> datetime:
    """The start of a day's period (a day: the store's length unless set)."""
    return _at(offset, 0, 0, 0)


def _part(start: datetime, table: str = "processed_transactions") -> str:
    return f"{table}_{start:%Y%m%d_%H%M%S}"


def _records(dsn: str, txn: str) -> list[Any]:
    return stack.fetch(dsn, "SELECT dedup_period, tableoid::regclass::text AS part, "
                            "fingerprint FROM processed_transactions WHERE txn_id = $1", txn)


def _decide(dsn: str, batch: list[Authorization]) -> list[Any]:
    async def go() -> list[Any]:
        store = await PostgresStore.connect(dsn)
        try:
            return await stack.authorize_in_order(store, batch)
        finally:
            await store.close()
    return asyncio.run(go())


# ------------------------------------------------------------------ claims across an end
def test_a_claim_outside_read_committed_is_refused(env: stack.Env) -> None:
    """The fence's probe of the period before must see what claims of that period committed
    after the transaction began: in REPEATABLE READ or SERIALIZABLE it would not, and the
    claim is refused (SQLSTATE 25001) before it reads or writes anything."""
    async def claim(isolation: str) -> str:
        conn = await asyncpg.connect(env.dsn)
        try:
            async with conn.transaction(isolation=isolation):
                return str(await conn.fetchval("SELECT payauth_claim_period()"))
        finally:
            await conn.close()

    assert asyncio.run(claim("read_committed"))
    for isolation in ("repeatable_read", "serializable"):
        with pytest.raises(asyncpg.PostgresError, match="needs READ COMMITTED") as refused:
            asyncio.run(claim(isolation))
        assert refused.value.sqlstate == "25001"


def test_two_claims_on_either_side_of_a_periods_end_yield_one_decision(env: stack.Env) -> None:
    """1. A batch claims X at 23:59:59.5 and stays open. 2. At 00:00:00.5 another batch
    claims X: it waits for the first (the fence), then finds X in the period before and
    loses its claim. One record. (X's account is unknown: no row lock serializes them.)"""
    _stop_the_clock(env.dsn)
    x = authorization(f"EDGE-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "5.00")

    async def scenario() -> Any:
        holding = await HeldOpenStore.connect(env.dsn)
        other = await PostgresStore.connect(env.dsn)
        try:
            await _clock_to(env.dsn, _at(0, 23, 59, 59, 500_000))
            first = asyncio.create_task(holding.authorize(
                [x], source_topic="t", source_partitions=[0], source_offsets=[0]))
            await asyncio.wait_for(holding.decided.wait(), 10)
            await _clock_to(env.dsn, _at(1, 0, 0, 0, 500_000))
            second = asyncio.create_task(other.authorize(
                [x], source_topic="t", source_partitions=[1], source_offsets=[0]))
            await stack.until_a_lock_is_awaited(env.dsn)  # the fence holds the second
            assert not second.done()
            holding.release.set()
            await first
            assert await second == []  # its claim lost, nothing of it written
        finally:
            await holding.close()
            await other.close()

    asyncio.run(scenario())
    assert [r["dedup_period"] for r in _records(env.dsn, x.transaction_id)] == [_day(0)]


def test_a_claim_that_straddles_a_periods_end_is_refused_and_retried_in_the_next(
        env: stack.Env) -> None:
    """A claim reads 23:59:59 and waits for its period's lock (an exclusive one held here);
    by the time it has it the period has ended: refused as a transient error, nothing
    written; decided again, it claims in the next period."""
    _stop_the_clock(env.dsn)
    asyncio.run(stack.seed_accounts(env.dsn, [("EDGE-ACC", "100.00", "EUR")]))
    x = authorization(f"EDGE-{uuid.uuid4().hex[:6]}", "EDGE-ACC", "5.00")

    async def scenario() -> None:
        blocker = await asyncpg.connect(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            await blocker.execute("SELECT pg_advisory_lock($1)",
                                  FENCE + int(_day(0).timestamp()))
            await _clock_to(env.dsn, _at(0, 23, 59, 59))
            claim = asyncio.create_task(store.authorize(
                [x], source_topic="t", source_partitions=[0], source_offsets=[0]))
            await stack.until_a_lock_is_awaited(env.dsn)
            await _clock_to(env.dsn, _at(1, 0, 0, 1))
            await blocker.execute("SELECT pg_advisory_unlock($1)",
                                  FENCE + int(_day(0).timestamp()))
            with pytest.raises(TransientError) as refused:
                await claim
            assert "straddled the end of the dedup period" in str(refused.value.__cause__)
            assert not await blocker.fetch(
                "SELECT 1 FROM processed_transactions WHERE txn_id = $1", x.transaction_id)
            await store.authorize([x], source_topic="t", source_partitions=[0],
                                  source_offsets=[0])
        finally:
            await blocker.close()
            await store.close()

    asyncio.run(scenario())
    assert [r["dedup_period"] for r in _records(env.dsn, x.transaction_id)] == [_day(1)]
    [balance] = stack.fetch(env.dsn, "SELECT balance FROM accounts")
    assert str(balance["balance"]) == "95.00"


def test_a_duplicate_and_a_conflict_in_the_next_period_through_the_broker(
        env: stack.Env, spawn_worker) -> None:
    """X approved on day 0; on day 1 (the worker without Redis: the store answers) X again
    is a duplicate, seen by PostgreSQL, and X with another amount a conflict,
    dead-lettered: one record, in day 0's partition, one event, one debit."""
    _stop_the_clock(env.dsn)
    asyncio.run(stack.seed_accounts(env.dsn, [("EDGE-ACC", "100.00", "EUR")]))
    txn = f"EDGE-{uuid.uuid4().hex[:6]}"
    _set_clock(env.dsn, _at(0, 12, 0, 0))
    worker = spawn_worker(env, PAYAUTH_REDIS_URL=f"redis://127.0.0.1:{stack.free_port()}/0")
    stack.produce(env.input_topic, [
        (txn, encode(auth_message(txn, account_id="EDGE-ACC", amount="10.00")))])
    [first] = stack.events_of(stack.read_topic(env.output_topic, expect=1))
    _set_clock(env.dsn, _at(1, 12, 0, 0))
    stack.produce(env.input_topic, [
        (txn, encode(auth_message(txn, account_id="EDGE-ACC", amount="10.00"))),
        (txn, encode(auth_message(txn, account_id="EDGE-ACC", amount="99.00")))])
    [dead] = stack.read_topic(env.dlq_topic, expect=1)
    sightings = wait_until(lambda: stack.fetch(
        env.dsn, "SELECT layer FROM duplicate_sightings WHERE $1 = ANY(txn_ids)", txn),
        30, "the duplicate seen")
    assert worker.terminate() == 0

    assert [r["layer"] for r in sightings] == ["postgres"]
    assert dict(dead.headers())["error.reason"] == b"IDEMPOTENCY_KEY_CONFLICT"
    assert [e["event_id"] for e in stack.events_of(stack.read_topic(env.output_topic))] == \
        [first["event_id"]]
    assert [r["part"] for r in _records(env.dsn, txn)] == [_part(_day(0))]
    [balance] = stack.fetch(env.dsn, "SELECT balance FROM accounts")
    assert str(balance["balance"]) == "90.00"


# ------------------------------------------------------------------ the periods ahead
def test_the_periods_ahead_are_made_and_a_record_made_before_its_period_moves_in(
        env: stack.Env) -> None:
    """The migration made today and two days ahead. On day 5 (none made), a claim goes to
    the default partition; preparing makes days 5 to 7 and moves it into day 5's."""
    parts = {r["p"] for r in stack.fetch(
        env.dsn, "SELECT relid::regclass::text AS p FROM pg_partition_tree("
                 "'processed_transactions') WHERE isleaf")}
    assert {_part(_day(d)) for d in range(3)} | {"processed_transactions_default"} == parts
    _stop_the_clock(env.dsn)
    _set_clock(env.dsn, _at(5, 8, 0, 0))
    x = authorization(f"AHEAD-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "5.00")
    _decide(env.dsn, [x])
    assert [r["part"] for r in _records(env.dsn, x.transaction_id)] == \
        ["processed_transactions_default"]

    day5 = _part(_day(5))
    assert asyncio.run(_made_by_a_worker(env.dsn))[0] == day5
    assert [r["part"] for r in _records(env.dsn, x.transaction_id)] == [day5]
    assert asyncio.run(_made_by_a_worker(env.dsn)) == []  # made once


def test_a_claim_into_the_default_partition_under_way_moves_with_the_rest(
        env: stack.Env) -> None:
    """On day 5 (no partition made), a claim goes to the default partition and stays open
    while the worker makes day 5's partition: making it waits for the claim (the table
    locked whole while the default partition's records move), then moves its record too.
    (Moving only what had committed, the attach then found the claim's record in the
    default partition and failed.)"""
    _stop_the_clock(env.dsn)
    _set_clock(env.dsn, _at(5, 8, 0, 0))
    first = authorization(f"MOVE-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "5.00")
    held = authorization(f"HELD-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "5.00")
    _decide(env.dsn, [first])

    _, made, _ = command_while_a_batch_decides(env, held,
                                               lambda: _made_by_a_worker(env.dsn), [])
    day5 = _part(_day(5))
    assert made[0] == day5
    for txn in (first, held):
        assert [r["part"] for r in _records(env.dsn, txn.transaction_id)] == [day5]


def test_the_period_under_way_is_made_while_another_period_is_vacuumed(
        env: stack.Env) -> None:
    """Making the period under way locks the store itself (its records in the default
    partition move meanwhile), never the other periods: a vacuum of today's partition
    (what autovacuum holds, SHARE UPDATE EXCLUSIVE) does not make it time out."""
    _stop_the_clock(env.dsn)
    _set_clock(env.dsn, _at(5, 8, 0, 0))
    x = authorization(f"AHEAD-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "5.00")
    _decide(env.dsn, [x])

    async def made_beside_a_vacuum() -> list[str]:
        vacuum = await asyncpg.connect(env.dsn)
        try:
            async with vacuum.transaction():
                await vacuum.execute(_AS_A_VACUUM_DOES.format(_part(_day(0))))
                return await _made_by_a_worker(env.dsn)
        finally:
            await vacuum.close()

    made = asyncio.run(made_beside_a_vacuum())
    assert made[0] == _part(_day(5))
    assert [r["part"] for r in _records(env.dsn, x.transaction_id)] == [_part(_day(5))]


async def _made_by_a_worker(dsn: str) -> list[str]:
    """The partitions a worker's store makes now (``prepare_dedup_periods``)."""
    store = await PostgresStore.connect(dsn)
    try:
        made, _ = await store.prepare_dedup_periods()
        return made
    finally:
        await store.close()


# ------------------------------------------------------------------ the purge
def _purge(dsn: str, hours: float = 72) -> int:
    async def go() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return await retention.purge(conn, retention_hours=hours)
        finally:
            await conn.close()
    return asyncio.run(go())


def test_the_purge_drops_whole_periods_and_deletes_only_what_was_set_back(
        env: stack.Env) -> None:
    """Days -5 and -4 hold two records each, day -1 one, today two (one of them set back
    100 days by an administrator, still a duplicate until the purge). With a 72 h window
    the purge drops days -5 and -4 whole (their partitions gone, and the partitions of the
    limits' charges counted in them), deletes the set-back record, and keeps the rest. A
    charge kept under a record of day -5 but counted today (an increment of its hold)
    stays. What the charges that went counted is kept (purged_limit_charges)."""
    _stop_the_clock(env.dsn)
    placed: dict[int, list[str]] = {}
    for day in (-5, -4, -1, 0):
        _set_clock(env.dsn, _at(day, 10, 0, 0))
        asyncio.run(_prepare_here(env.dsn))
        batch = [authorization(f"P{day}-{i}-{uuid.uuid4().hex[:4]}", "NO-SUCH-ACCOUNT",
                               "1.00") for i in range(1 if day == -1 else 2)]
        _decide(env.dsn, batch)
        placed[day] = [a.transaction_id for a in batch]
        # (Decided "then": each record's time within its own day.)
        stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = $1 "
                             "WHERE txn_id = ANY($2)", _at(day, 10, 0, 0), placed[day])
    _set_clock(env.dsn, None)
    # Each charge: (kept under, counted in the period of whose record).
    charges = [(placed[-5][0], placed[-5][0]), (placed[0][0], placed[0][0]),
               (placed[-5][1], placed[0][0]), (placed[-4][0], placed[-4][0]),
               (placed[-1][0], placed[-1][0])]
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "SELECT c.under, c.under, 'L', current_date, 1, 1, "
                         "       (SELECT p.dedup_period FROM processed_transactions p "
                         "         WHERE p.txn_id = c.counted) "
                         "  FROM unnest($1::text[], $2::text[]) AS c(under, counted)",
                [c[0] for c in charges], [c[1] for c in charges])
    set_back = placed[0][1]
    stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = now() - "
                         "interval '100 days' WHERE txn_id = $1", set_back)

    async def still_a_duplicate() -> bool:
        store = await PostgresStore.connect(env.dsn)
        try:
            return set_back in await store.load_stored([set_back])
        finally:
            await store.close()

    assert asyncio.run(still_a_duplicate())
    assert _purge(env.dsn) == 5
    left = {r["txn_id"] for r in stack.fetch(env.dsn,
                                             "SELECT txn_id FROM processed_transactions")}
    assert left == {*placed[-1], placed[0][0]}
    for day in (-5, -4):
        for table in ("processed_transactions", "limit_charges"):
            assert stack.fetch(env.dsn, "SELECT to_regclass($1) AS r",
                               _part(_day(day), table))[0]["r"] is None
    assert sorted(r["txn_id"] for r in stack.fetch(env.dsn, "SELECT txn_id FROM limit_charges")) \
        == sorted([placed[0][0], placed[-5][1], placed[-1][0]])
    [purged] = stack.fetch(env.dsn, "SELECT sum(amount) AS amount, sum(count) AS count "
                                    "FROM purged_limit_charges WHERE limit_id = 'L'")
    assert tuple(purged) == (2, 2)
    assert not stack.fetch(env.dsn, "SELECT 1 FROM pg_class WHERE relname LIKE '%purged'")
    assert _purge(env.dsn) == 0


def _on_card(txn: str, kind: str, amount: str, original: str | None = None) -> Authorization:
    """A message of account LIM-ACC on its card LIM-CARD (stamped on the limit's one day)."""
    return decode_authorization(encode(auth_message(
        txn, account_id="LIM-ACC", amount=amount, authorization_type=kind,
        card_id="LIM-CARD", **({"original_transaction_id": original} if original else {}))))


def _limit_usage(dsn: str) -> tuple[Any, int]:
    row = stack.fetch(dsn, "SELECT amount, count FROM limit_usage WHERE limit_id = 'LIM'")[0]
    return row["amount"], row["count"]


def test_a_hold_that_stands_keeps_its_limits_charges_past_the_window(env: stack.Env) -> None:
    """Day -5: a hold of 50 and one of 30 on a card with a daily limit, the second reversed
    whole; today an increment of 20 of the first, and a hold of 20 whose record an
    administrator set back 100 days (usage 90, count 3). The purge drops day -5 and deletes
    the set-back record: the charges of the holds that stand stay, with today's period
    (looked at again when that one is dropped), the ended hold's goes. A partial reversal
    of 60 then gives back the increment's 20 and 40 of the authorization's 50, keeping the
    counts (seen failing with the authorization's charge gone with its day: 20 given back);
    the reversal of the last 10 gives its two counts back."""
    _stop_the_clock(env.dsn)
    asyncio.run(stack.seed_accounts(env.dsn, [("LIM-ACC", "1000.00", "EUR")]))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ('LIM-CARD', "
                         "'LIM-ACC')")
    stack.fetch(env.dsn, "INSERT INTO spending_limits (limit_id, scope, scope_id, period, "
                         "max_amount, max_count) VALUES ('LIM', 'CARD', 'LIM-CARD', 'DAY', "
                         "500, 10)")
    tag = uuid.uuid4().hex[:6]
    stands, ended, set_back = f"H1-{tag}", f"H2-{tag}", f"H3-{tag}"
    _set_clock(env.dsn, _at(-5, 10, 0, 0))
    asyncio.run(_prepare_here(env.dsn))
    _decide(env.dsn, [_on_card(stands, "AUTHORIZATION", "50.00"),
                      _on_card(ended, "AUTHORIZATION", "30.00")])
    _decide(env.dsn, [_on_card(f"R2-{tag}", "REVERSAL", "30.00", ended)])
    stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = $1",
                _at(-5, 10, 0, 0))
    _set_clock(env.dsn, None)
    asyncio.run(_prepare_here(env.dsn))
    _decide(env.dsn, [_on_card(f"I1-{tag}", "INCREMENTAL", "20.00", stands),
                      _on_card(set_back, "AUTHORIZATION", "20.00")])
    stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = now() - "
                         "interval '100 days' WHERE txn_id = $1", set_back)
    assert _limit_usage(env.dsn) == (90, 3)

    assert _purge(env.dsn) == 4
    assert stack.fetch(env.dsn, "SELECT to_regclass($1) AS r", _part(_day(-5)))[0]["r"] is None
    charges = stack.fetch(env.dsn, "SELECT txn_id, charged_by, amount, dedup_period "
                                   "FROM limit_charges ORDER BY charged_by")
    assert [(c["txn_id"], c["charged_by"], c["amount"], c["dedup_period"]) for c in charges] \
        == [(stands, stands, 50, _day(0)), (set_back, set_back, 20, _day(0)),
            (stands, f"I1-{tag}", 20, _day(0))]

    _decide(env.dsn, [_on_card(f"R1-{tag}", "REVERSAL", "60.00", stands)])
    assert _limit_usage(env.dsn) == (30, 3)
    _decide(env.dsn, [_on_card(f"R3-{tag}", "REVERSAL", "10.00", stands)])
    assert _limit_usage(env.dsn) == (20, 1)
    assert stack.fetch(env.dsn, "SELECT state FROM holds WHERE txn_id = $1",
                       stands)[0]["state"] == "REVERSED"


def test_a_purge_batch_chosen_to_end_a_deadlock_is_taken_again(env: stack.Env) -> None:
    """A record set back 100 days, with two limits' charges kept under it. A transaction
    holds both charges while the purge's row-by-row batch, which has locked the record,
    waits for them; it then asks for the record: a deadlock, and the purge, waiting longer,
    is chosen to end it (the other gets the record: the batch was rolled back, not
    committed). The purge takes the batch again once the other has committed, and the
    record and its charges go (seen failing with the DeadlockDetectedError raised)."""
    txn = f"SB-{uuid.uuid4().hex[:6]}"
    _decide(env.dsn, [authorization(txn, "NO-SUCH-ACCOUNT", "1.00")])
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "SELECT p.txn_id, p.txn_id, l.id, current_date, 1, 1, p.dedup_period "
                         "  FROM processed_transactions p, unnest('{L1,L2}'::text[]) AS l(id) "
                         " WHERE p.txn_id = $1", txn)
    stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = now() - "
                         "interval '100 days' WHERE txn_id = $1", txn)

    async def purge_into_a_deadlock() -> tuple[int, bool]:
        other = await asyncpg.connect(env.dsn)
        purger = await asyncpg.connect(env.dsn, server_settings={"application_name": "purge"})
        try:
            async with other.transaction():
                assert len(await other.fetch(
                    "SELECT 1 FROM limit_charges WHERE txn_id = $1 FOR UPDATE", txn)) == 2
                purging = asyncio.create_task(retention.purge(purger, retention_hours=72))
                await stack.until_a_lock_is_awaited(env.dsn, "purge")  # behind a charge
                record_kept = bool(await other.fetch(
                    "SELECT 1 FROM processed_transactions WHERE txn_id = $1 FOR UPDATE", txn))
            return await purging, record_kept
        finally:
            await purger.close()
            await other.close()

    deleted, record_kept = asyncio.run(purge_into_a_deadlock())
    assert record_kept  # the purge's batch was the deadlock's victim, rolled back
    assert deleted == 1
    assert not _records(env.dsn, txn)
    assert not stack.fetch(env.dsn, "SELECT 1 FROM limit_charges WHERE txn_id = $1", txn)


def _decided_five_days_ago(dsn: str) -> Authorization:
    """A transaction decided on day -5 (its record in that day's partition, its time within
    it), the store's clock then back to the server's and today's periods made."""
    _stop_the_clock(dsn)
    _set_clock(dsn, _at(-5, 10, 0, 0))
    asyncio.run(_prepare_here(dsn))
    old = authorization(f"OLD-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "1.00")
    _decide(dsn, [old])
    stack.fetch(dsn, "UPDATE processed_transactions SET processed_at = $1 WHERE txn_id = $2",
                _at(-5, 10, 0, 0), old.transaction_id)
    _set_clock(dsn, None)
    asyncio.run(_prepare_here(dsn))
    return old


def test_a_period_past_the_window_is_dropped_while_another_period_is_vacuumed(
        env: stack.Env) -> None:
    """Today's partition, which takes every claim, is the one autovacuum works through most
    often: the drop of day -5 locks the store itself and the period it detaches, never the
    others, so it does not wait for (nor time out behind) a vacuum of today's period; and
    claims go on meanwhile."""
    _decided_five_days_ago(env.dsn)

    async def drop_beside_a_vacuum() -> tuple[list[Any], list[Any]]:
        vacuum = await asyncpg.connect(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            async with vacuum.transaction():
                await vacuum.execute(_AS_A_VACUUM_DOES.format(_part(_day(0))))
                dropped = await conn.fetch("SELECT * FROM payauth_dedup_drop_period(72)")
                decided = await stack.authorize_in_order(store, [authorization(
                    f"NEW-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "1.00")])
        finally:
            await store.close()
            await conn.close()
            await vacuum.close()
        return dropped, decided

    dropped, decided = asyncio.run(drop_beside_a_vacuum())
    assert [(r["part"], r["records"]) for r in dropped] == [(_part(_day(-5)), 1)]
    assert len(decided) == 1


def test_a_drop_waiting_for_a_vacuum_of_its_period_makes_no_claim_wait(
        env: stack.Env) -> None:
    """A vacuum of the period past the window (one of autovacuum's is cancelled by
    PostgreSQL after deadlock_timeout; a manual or an anti-wraparound one is waited for):
    the drop waits for it holding nothing a claim needs, neither the store nor the limits'
    charges counted in that period (a reversal's give-back locks its original's), so a
    claim decided and a charge locked meanwhile go on before the drop does, and the drop
    goes on once the vacuum is over; the charge goes after it."""
    old = _decided_five_days_ago(env.dsn)
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "VALUES ($1, $1, 'L', current_date, 1, 1, $2)",
                old.transaction_id, _day(-5))

    async def drop_behind_a_vacuum() -> tuple[list[Any], bool]:
        vacuum = await asyncpg.connect(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        give_back = await asyncpg.connect(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            async with vacuum.transaction():
                await vacuum.execute(_AS_A_VACUUM_DOES.format(_part(_day(-5))))
                drop = asyncio.create_task(
                    conn.fetch("SELECT * FROM payauth_dedup_drop_period(72)"))
                await stack.until_a_lock_is_awaited(env.dsn)  # the drop, behind the vacuum
                await stack.authorize_in_order(store, [authorization(
                    f"NEW-{uuid.uuid4().hex[:6]}", "NO-SUCH-ACCOUNT", "1.00")])
                async with give_back.transaction():
                    await give_back.execute("SET LOCAL lock_timeout = '500ms'")
                    assert await give_back.fetch(
                        "SELECT 1 FROM limit_charges WHERE txn_id = $1 FOR UPDATE",
                        old.transaction_id)
                claim_first = not drop.done()
            return await drop, claim_first
        finally:
            await store.close()
            await give_back.close()
            await conn.close()
            await vacuum.close()

    dropped, claim_first = asyncio.run(drop_behind_a_vacuum())
    assert claim_first
    assert [(r["part"], r["records"]) for r in dropped] == [(_part(_day(-5)), 1)]
    stack.fetch(env.dsn, "SELECT * FROM payauth_limit_charges_drop_periods()")
    assert not stack.fetch(env.dsn, "SELECT 1 FROM limit_charges WHERE txn_id = $1",
                           old.transaction_id)


def test_a_charge_given_back_while_its_period_is_dropped_stays_with_its_standing_hold(
        env: stack.Env) -> None:
    """The charges' drop reads whether a charge's hold stands without locking the hold: a
    reversal that gives part of the charge back (its row locked, the hold left active)
    while the drop waits for that row is committed first, and the drop then keeps the
    charge, as the reversal left it, with today's period (seen failing with the charge
    deleted)."""
    _decided_five_days_ago(env.dsn)
    hold = f"HOLD-{uuid.uuid4().hex[:6]}"
    stack.fetch(env.dsn, "INSERT INTO holds (txn_id, account_id, currency, kind, amount, "
                         "remaining, state, limited) "
                         "VALUES ($1, 'NO-SUCH-ACCOUNT', 'EUR', 'AUTHORIZATION', 50, 50, "
                         "'ACTIVE', true)", hold)
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "VALUES ($1, $1, 'L', current_date, 50, 1, $2)", hold, _day(-5))

    [store_dropped] = stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_period(72)")
    assert store_dropped["part"] == _part(_day(-5))

    async def drop_beside_a_reversal() -> list[Any]:
        conn = await asyncpg.connect(env.dsn)
        reversal = await asyncpg.connect(env.dsn)
        try:
            async with reversal.transaction():  # as payauth_limits_give_back does
                assert await reversal.fetch(
                    "SELECT 1 FROM limit_charges WHERE txn_id = $1 FOR UPDATE", hold)
                await reversal.execute("UPDATE limit_charges SET amount = amount - 20 "
                                       "WHERE txn_id = $1", hold)
                await reversal.execute("UPDATE holds SET remaining = 30 WHERE txn_id = $1",
                                       hold)
                drop = asyncio.create_task(
                    conn.fetch("SELECT * FROM payauth_limit_charges_drop_periods()"))
                await stack.until_a_lock_is_awaited(env.dsn)  # the drop, behind the charge
            return await drop
        finally:
            await reversal.close()
            await conn.close()

    dropped = asyncio.run(drop_beside_a_reversal())
    assert [r[0] for r in dropped] == [_part(_day(-5), "limit_charges")]
    assert [(r["amount"], r["dedup_period"]) for r in stack.fetch(
        env.dsn, "SELECT amount, dedup_period FROM limit_charges WHERE txn_id = $1", hold)] \
        == [(30, _day(0))]


def test_verify_counts_the_charges_detached_until_they_are_summed(env: stack.Env) -> None:
    """Charges of day -5 counted in a usage: once their partition is detached, and until
    it is summed into purged_limit_charges and dropped, verify holds the usage to them
    where they are (seen failing: usage 3 / 1 in L, charges 0 / 0, purged 0 / 0)."""
    old = _decided_five_days_ago(env.dsn)
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "VALUES ($1, $1, 'L', current_date, 3, 1, $2), "
                         "       ($1, $1, 'M', current_date, 4, 1, $2)",
                old.transaction_id, _day(-5))
    stack.fetch(env.dsn, "INSERT INTO limit_usage VALUES ('L', current_date, 3, 1), "
                         "('M', current_date, 4, 1)")
    assert stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_period(72)")
    [detached] = stack.fetch(env.dsn, "SELECT * FROM payauth_limit_charges_drop_periods()")
    assert detached[0] == _part(_day(-5), "limit_charges")
    assert not stack.fetch(env.dsn, "SELECT 1 FROM limit_charges")
    assert _USAGE_HELD in report(asyncio.run(verify(env.dsn)))[0].splitlines()
    stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_purged()")
    assert [tuple(r) for r in stack.fetch(
        env.dsn, "SELECT limit_id, amount, count FROM purged_limit_charges "
                 "ORDER BY limit_id")] == [("L", 3, 1), ("M", 4, 1)]
    assert _USAGE_HELD in report(asyncio.run(verify(env.dsn)))[0].splitlines()


_DETACH_CHARGES = "SELECT * FROM payauth_limit_charges_drop_periods()"


def _a_charge_of_day_minus_five_to_detach(dsn: str) -> None:
    """A charge of 3 in limit L, counted in its usage, in day -5's charges partition; the
    store's day -5 dropped, so that the charges' detach takes that partition next."""
    old = _decided_five_days_ago(dsn)
    stack.fetch(dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, period_start, "
                     "amount, count, dedup_period) "
                     "VALUES ($1, $1, 'L', current_date, 3, 1, $2)",
                old.transaction_id, _day(-5))
    stack.fetch(dsn, "INSERT INTO limit_usage VALUES ('L', current_date, 3, 1)")
    assert stack.fetch(dsn, "SELECT * FROM payauth_dedup_drop_period(72)")


def _detached_beside(dsn: str, work: Callable[[], Awaitable[T]], *, hold: str,
                     let_go: str) -> tuple[T, list[Any]]:
    """``work`` started while a connection of the test holds it at a gate (``hold``, then
    ``let_go`` on that connection); the charges' detach tried beside it until it waits for a
    lock or is done; then the gate let go. What ``work`` returned, and the partitions the
    detach took (tried again once ``work`` is done if it waited out its lock_timeout)."""

    async def scenario() -> tuple[T, list[Any]]:
        holder = await asyncpg.connect(dsn)
        detacher = await asyncpg.connect(dsn, server_settings={"application_name": "detacher"})
        try:
            await holder.execute(hold)
            working = asyncio.create_task(work())
            await stack.until_a_lock_is_awaited(dsn)  # work at the gate
            detaching = asyncio.create_task(detacher.fetch(_DETACH_CHARGES))
            waiting = asyncio.create_task(stack.until_a_lock_is_awaited(dsn, "detacher"))
            await asyncio.wait([waiting, detaching], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            await holder.execute(let_go)
            done = await working
            try:
                detached = await detaching
            except asyncpg.LockNotAvailableError:  # waited out its lock_timeout
                detached = []
            return done, detached
        finally:
            await holder.close()
            await detacher.close()

    done, detached = asyncio.run(scenario())
    return done, detached or stack.fetch(dsn, _DETACH_CHARGES)


def test_a_charges_detach_waits_for_a_verify_under_way(
        env: stack.Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify takes its snapshot, then reads limit_charges and the detached tables in
    statements after it. A detach committed in between would hide that period's charges
    from both (the partition gone from the table, the table not yet detached in the
    snapshot): verify locks limit_charges before its snapshot, so the detach waits for it
    (seen failing with the lock taken after the snapshot: usage 3, charges 0). Verify is held
    at a gate, the first check after its snapshot, until the detach waits or is done."""
    _a_charge_of_day_minus_five_to_detach(env.dsn)
    gate_key = 7_042_001
    gate = Check("the test's gate", "SELECT 'held' WHERE (SELECT pg_advisory_xact_lock_shared"
                                    f"({gate_key})::text) IS NULL")
    monkeypatch.setattr(verify_module, "CHECKS", (gate, *verify_module.CHECKS))

    said, detached = _detached_beside(
        env.dsn, lambda: verify(env.dsn), hold=f"SELECT pg_advisory_lock({gate_key})",
        let_go=f"SELECT pg_advisory_unlock({gate_key})")
    assert _USAGE_HELD in report(said)[0].splitlines()
    assert [r[0] for r in detached] == [_part(_day(-5), "limit_charges")]
    assert _USAGE_HELD in report(asyncio.run(verify(env.dsn)))[0].splitlines()


def test_a_charges_detach_waits_for_the_detached_charges_to_be_summed_and_dropped(
        env: stack.Env) -> None:
    """payauth_dedup_drop_purged sums the detached charges' tables in one statement, then
    drops every detached table in the next: a table detached between the two would be
    dropped unsummed, what it counted lost to verify. The function locks limit_charges
    first, so the detach waits for it (seen failing without that lock: L's 3 not in
    purged_limit_charges). It is held at a gate, reading a detached table of an earlier
    period that the test keeps locked, until the detach waits or is done."""
    _a_charge_of_day_minus_five_to_detach(env.dsn)
    earlier = "limit_charges_20000101_000000_purged"
    stack.fetch(env.dsn, f"CREATE TABLE {earlier} (LIKE limit_charges)")
    stack.fetch(env.dsn, f"INSERT INTO {earlier} (txn_id, charged_by, limit_id, period_start, "
                         "amount, count, dedup_period) "
                         "VALUES ('E', 'E', 'E-LIM', '2000-01-01', 5, 1, '2000-01-01')")
    stack.fetch(env.dsn, "INSERT INTO limit_usage VALUES ('E-LIM', '2000-01-01', 5, 1)")

    async def sum_and_drop() -> list[Any]:
        conn = await asyncpg.connect(env.dsn)
        try:
            return await conn.fetch("SELECT * FROM payauth_dedup_drop_purged()")
        finally:
            await conn.close()

    dropped, detached = _detached_beside(
        env.dsn, sum_and_drop, hold=f"BEGIN; LOCK TABLE {earlier} IN ACCESS EXCLUSIVE MODE",
        let_go="COMMIT")
    assert earlier in [r[0] for r in dropped]
    assert [r[0] for r in detached] == [_part(_day(-5), "limit_charges")]
    stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_purged()")  # what came meanwhile
    assert [tuple(r) for r in stack.fetch(
        env.dsn, "SELECT limit_id, amount, count FROM purged_limit_charges "
                 "ORDER BY limit_id")] == [("E-LIM", 5, 1), ("L", 3, 1)]
    assert _USAGE_HELD in report(asyncio.run(verify(env.dsn)))[0].splitlines()


def test_a_record_set_within_the_window_while_its_period_is_dropped_keeps_it(
        env: stack.Env) -> None:
    """The drop reads whether its period holds a record within the window before it locks
    the store: an administrator who sets such a record's processed_at within the window
    meanwhile (committed while the drop waits for the store) makes the drop read again
    under the lock and give up whole: the period, the record and its charge all kept."""
    old = _decided_five_days_ago(env.dsn)
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "VALUES ($1, $1, 'L', current_date, 1, 1, $2)",
                old.transaction_id, _day(-5))

    async def drop_while_set_within_the_window() -> None:
        admin = await asyncpg.connect(env.dsn)
        conn = await asyncpg.connect(env.dsn)
        try:
            async with admin.transaction():
                await admin.execute("UPDATE processed_transactions SET processed_at = now() "
                                    "WHERE txn_id = $1", old.transaction_id)
                drop = asyncio.create_task(
                    conn.fetch("SELECT * FROM payauth_dedup_drop_period(72)"))
                await stack.until_a_lock_is_awaited(env.dsn)  # the drop, for the store
            with pytest.raises(asyncpg.SerializationError, match="within the window"):
                await drop
        finally:
            await conn.close()
            await admin.close()

    asyncio.run(drop_while_set_within_the_window())
    assert [r["part"] for r in _records(env.dsn, old.transaction_id)] == [_part(_day(-5))]
    assert stack.fetch(env.dsn, "SELECT 1 FROM limit_charges WHERE txn_id = $1",
                       old.transaction_id)


async def _prepare_here(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await retention.prepare_periods(conn)
    finally:
        await conn.close()


# ------------------------------------------------------------------ the upgrade
def test_the_upgrade_keeps_every_record_and_each_still_guards(live_stack: None,
                                                              tmp_path: Path) -> None:
    """A store at migration 017 with records (one of each day of the last three); then the
    upgrade: every record kept, field for field, in the partition of the periods before;
    each still a duplicate, and a claim of one that a stale lookup missed is lost."""
    database, dsn = asyncio.run(stack.database_before("018", tmp_path))

    async def scenario() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO processed_transactions (txn_id, processed_at, result, "
                "fingerprint, account_id, amount, currency, authorization_type) "
                "SELECT 'OLD-' || d, now() - d * interval '1 day', 'APPROVED', 'fp' || d, "
                "'ACC', d + 1, 'EUR', 'PURCHASE' FROM generate_series(0, 2) AS d")
            before = [dict(r) for r in await conn.fetch(
                "SELECT * FROM processed_transactions ORDER BY txn_id")]
            # The upgrade's day is the server's when it runs (this test may cross midnight).
            upgrade_days = {await conn.fetchval(_THE_DAY_BEFORE)}
            await migrate(dsn)
            upgrade_days.add(await conn.fetchval(_THE_DAY_BEFORE))
            after = [dict(r) for r in await conn.fetch(
                "SELECT *, tableoid::regclass::text AS part FROM processed_transactions "
                "ORDER BY txn_id")]
            assert [r.pop("part") for r in after] == ["processed_transactions_before_periods"] * 3
            [kept_in] = {r.pop("dedup_period") for r in after}
            assert kept_in in upgrade_days
            # (a column a later migration added: empty on the records made before it)
            assert [r.pop("input_limit_reads") for r in after] == [None] * 3
            assert after == before
            # the partition of before took the identifier check of later migrations (019)
            assert await conn.fetchval(
                "SELECT convalidated FROM pg_constraint WHERE conname = "
                "'processed_transactions_txn_id_check' AND conrelid = "
                "'processed_transactions_before_periods'::regclass") is True
            store = await PostgresStore.connect(dsn)
            try:
                assert set(await store.load_stored(["OLD-0", "OLD-2"])) == {"OLD-0", "OLD-2"}
                # its lookup made before the upgrade: its claim lost, nothing written
                assert await store.authorize([authorization("OLD-1", "ACC", "2")],
                                             source_topic="t", source_partitions=[0],
                                             source_offsets=[0]) == []
            finally:
                await store.close()
        finally:
            await conn.close()

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(stack.drop_database(database))


# ------------------------------------------------------------------ another length
def test_a_store_of_minute_periods_purges_whole_minutes_within_a_window_of_minutes(
        env: stack.Env) -> None:
    """A store made with periods of a minute (refused once it holds records): its
    partitions are minutes, ten of them ahead; records claimed at 10:00:30, 10:01:30 and
    10:04:30, a purge at 10:05:10 with a window of 3 minutes drops the periods of 10:00 and
    10:01 whole (ended by 10:02:10) and keeps 10:04's."""
    _stop_the_clock(env.dsn)
    _set_clock(env.dsn, _at(1, 10, 0, 30))
    made = [r[0] for r in stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_set_period(60)")]
    assert made[:2] == [_part(_at(1, 10, 0, 0)), _part(_at(1, 10, 1, 0))]
    assert made[11:13] == [_part(_at(1, 10, 0, 0), "limit_charges"),
                           _part(_at(1, 10, 1, 0), "limit_charges")] and len(made) == 22
    claimed = {}
    for minute in (0, 1, 4):
        _set_clock(env.dsn, _at(1, 10, minute, 30))
        x = authorization(f"MIN{minute}-{uuid.uuid4().hex[:4]}", "NO-SUCH-ACCOUNT", "1.00")
        _decide(env.dsn, [x])
        claimed[minute] = x.transaction_id
        stack.fetch(env.dsn, "UPDATE processed_transactions SET processed_at = $1 "
                             "WHERE txn_id = $2", _at(1, 10, minute, 30), x.transaction_id)
    with pytest.raises(asyncpg.RaiseError, match="holds records"):
        asyncio.run(_call(env.dsn, "SELECT * FROM payauth_dedup_set_period(120)"))

    _set_clock(env.dsn, _at(1, 10, 5, 10))
    dropped = stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_period(0.05)")
    assert [(r["part"], r["records"]) for r in dropped] == [(_part(_at(1, 10, 0, 0)), 1)]
    dropped = stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_period(0.05)")
    assert [(r["part"], r["records"]) for r in dropped] == [(_part(_at(1, 10, 1, 0)), 1)]
    assert not stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_drop_period(0.05)")
    left = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")
    assert [r["txn_id"] for r in left] == [claimed[4]]
    detached = stack.fetch(env.dsn, "SELECT * FROM payauth_limit_charges_drop_periods()")
    assert [r[0] for r in detached] == [_part(_at(1, 10, minute, 0), "limit_charges")
                                        for minute in (0, 1)]


def test_the_periods_keep_their_length_while_a_charge_is_kept(env: stack.Env) -> None:
    """A store without records but a spending limit's charge (a standing hold's, kept past
    its record): its partitions, and the charges', keep their length, and the charge."""
    stack.fetch(env.dsn, "INSERT INTO limit_charges (txn_id, charged_by, limit_id, "
                         "period_start, amount, count, dedup_period) "
                         "VALUES ('H', 'H', 'L', current_date, 1, 1, now())")
    with pytest.raises(asyncpg.RaiseError, match="keep charges"):
        asyncio.run(_call(env.dsn, "SELECT * FROM payauth_dedup_set_period(60)"))
    assert stack.fetch(env.dsn, "SELECT txn_id FROM limit_charges")[0]["txn_id"] == "H"



# (The charges' check of `payauth verify`, passing: the records above are no whole
# decisions, which other checks would name.)
_USAGE_HELD = "PASS  each spending limit's usage is what its charges count"


def test_the_upgrade_keeps_every_charge_and_drops_them_whole_with_their_periods(
        live_stack: None, tmp_path: Path) -> None:
    """Spending limits' charges at migration 031 (one counted in the period under way, one
    before charges had a period under a record still kept, one under a record gone); then
    the upgrade: every charge kept, field for field, in the charges' partition of before
    (the one without a period given its record's, or the earliest time there is), the
    periods after it partitioned, each usage still its charges. Five days on, once the
    store has dropped every period that partition covers, it goes whole, what it counted
    kept as purged."""
    database, dsn = asyncio.run(stack.database_before("032", tmp_path))

    async def upgrade() -> tuple[list[dict], list[dict], datetime]:
        conn = await asyncpg.connect(dsn)
        try:
            record_period = await conn.fetchval(
                "INSERT INTO processed_transactions (txn_id, processed_at, result, "
                "fingerprint, account_id, amount, currency, authorization_type) "
                "VALUES ('OLD-P', now(), 'APPROVED', 'fp', 'ACC', 5, 'EUR', 'PURCHASE') "
                "RETURNING dedup_period")
            await conn.execute(
                "INSERT INTO limit_charges (txn_id, charged_by, limit_id, period_start, "
                "amount, count, dedup_period) VALUES "
                "('OLD-P', 'OLD-P', 'L', current_date, 5, 1, NULL), "
                "('GONE', 'GONE', 'L', current_date, 3, 1, NULL), "
                "('NEW', 'NEW', 'L', current_date, 2, 1, $1)", record_period)
            await conn.execute("INSERT INTO limit_usage VALUES ('L', current_date, 10, 3)")
            before = [dict(r) for r in await conn.fetch(
                "SELECT txn_id, charged_by, limit_id, period_start, amount, count "
                "FROM limit_charges ORDER BY txn_id")]
            await migrate(dsn)
            after = [dict(r) for r in await conn.fetch(
                "SELECT txn_id, charged_by, limit_id, period_start, amount, count, "
                "       tableoid::regclass::text AS part, "
                "       nullif(dedup_period, '-infinity') AS period "
                "FROM limit_charges ORDER BY txn_id")]
            assert await conn.fetchval("SELECT relkind FROM pg_class "
                                       "WHERE relname = 'limit_charges'") == b"p"
        finally:
            await conn.close()
        return before, after, record_period

    try:
        before, after, record_period = asyncio.run(upgrade())
        assert [r.pop("part") for r in after] == ["limit_charges_before_periods"] * 3
        assert [r.pop("period") for r in after] == [None, record_period, record_period]
        assert after == before
        assert _USAGE_HELD in report(asyncio.run(verify(dsn)))[0].splitlines()
        assert stack.fetch(dsn, "SELECT to_regclass($1) AS r",
                           _part(_day(1), "limit_charges"))[0]["r"] is not None

        _stop_the_clock(dsn)
        _set_clock(dsn, _at(5, 10, 0, 0))
        assert _purge(dsn) == 1
        assert not stack.fetch(dsn, "SELECT 1 FROM limit_charges")
        assert [tuple(r) for r in stack.fetch(
            dsn, "SELECT sum(amount), sum(count) FROM purged_limit_charges")] == [(10, 3)]
        assert _USAGE_HELD in report(asyncio.run(verify(dsn)))[0].splitlines()
    finally:
        asyncio.run(stack.drop_database(database))


_CONTRACT_COLUMNS_ONLY = (
    "INSERT INTO processed_transactions (txn_id, processed_at, result, fingerprint, "
    "account_id, amount, currency, authorization_type) "
    "VALUES ($1, now(), 'APPROVED', 'fp', 'ACC', 1, 'EUR', 'PURCHASE') RETURNING dedup_period")


def test_a_record_inserted_by_the_contracts_columns_alone_takes_its_period(
        env: stack.Env) -> None:
    """An insert naming only the contract's columns (an administrator's) is dated to the
    start of the period under way, in the store's period length (set again with it): a
    second one of the same transaction_id in that period, in another transaction, meets
    the first on the primary key."""
    txn = f"ADMIN-{uuid.uuid4().hex[:6]}"
    [first] = stack.fetch(env.dsn, _CONTRACT_COLUMNS_ONLY, txn)
    period = first["dedup_period"]
    assert period.timestamp() % 86400 == 0
    assert datetime.now(UTC) - period < timedelta(days=1)
    with pytest.raises(asyncpg.UniqueViolationError):
        stack.fetch(env.dsn, _CONTRACT_COLUMNS_ONLY, txn)

    stack.fetch(env.dsn, "DELETE FROM processed_transactions WHERE txn_id = $1", txn)
    stack.fetch(env.dsn, "SELECT * FROM payauth_dedup_set_period(600)")
    [ten] = stack.fetch(env.dsn, _CONTRACT_COLUMNS_ONLY, txn)
    assert ten["dedup_period"].timestamp() % 600 == 0
    assert datetime.now(UTC) - ten["dedup_period"] < timedelta(minutes=10)

async def _call(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.fetch(statement)
    finally:
        await conn.close()
