"""``payauth_authorize`` (sql/payauth_authorize.sql) against a batch deciding at the same
moment on another connection: an orphan reversal kept by one batch and its purchase decided
by another, interleaved exactly as a review found them losing the reversal's credit (the
purchase's batch reading the waiting orphans before it locked the account); a clearing kept
before its hold and the hold decided by another batch, at the same point; two purchases of
one card with room in its limit for one; a card frozen, and a limit loaded, while a batch
decides for its account (by command, by hand, or applied by a replication feed); a batch
naming a hold of an account it has not locked while that hold's batch is open; a claim lost
to a batch still open, which costs its own message and not the batch; an original of another
account committed while a batch decides a reversal or clearing that names it (found a
mismatch, or not found at all, never released or credited on the wrong account); and the
first race many times over through two stores, as two workers' batches meet."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from service.adapters.postgres import PostgresStore
from service.core.ports import TransientError
from service.domain.messages import Authorization, decode_authorization
from service.ops import accounts, cards, limits
from service.ops.verify import report, verify
from tests.support import stack
from tests.support.factory import auth_message, authorization, encode
from tests.support.held_open import HeldOpenStore, command_while_a_batch_decides


def _decided_while_the_other_waits(env: stack.Env, held: Authorization,
                                   waiting: Authorization) -> tuple[Any, Any]:
    """``held`` decided by a batch that keeps its transaction open (its account locked);
    then ``waiting`` decided by another batch, which must wait for that account; then the
    first commits. Both batches' rows."""

    async def decide_waiting() -> Any:
        store = await PostgresStore.connect(env.dsn)
        try:
            [row] = await store.authorize([waiting], source_topic="t", source_partitions=[2],
                                          source_offsets=[0])
            return row
        finally:
            await store.close()

    first, second, _ = command_while_a_batch_decides(env, held, decide_waiting, [])
    return first, second


def _a_card(env: stack.Env, balance: str) -> tuple[str, str]:
    """A new account with ``balance`` and a card of it: (account, card)."""
    account = f"RACE-{uuid.uuid4().hex[:6]}"
    card = f"CARD-{account}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, balance, "EUR")]))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ($1, $2) RETURNING 1",
                card, account)
    return account, card


def _purchase(txn: str, account: str, amount: str, card: str | None) -> Authorization:
    """A purchase of ``account``, on ``card`` where one is given."""
    return decode_authorization(encode(auth_message(
        txn, account_id=account, amount=amount, **({"card_id": card} if card else {}))))


def _on_card(txn: str, account: str, card: str, amount: str) -> Authorization:
    """A purchase of ``account`` on ``card`` (its transaction id made unique by the account)."""
    return decode_authorization(encode(auth_message(
        f"{txn}-{account}", account_id=account, amount=amount, card_id=card)))


def test_an_orphan_kept_while_its_purchase_is_decided_elsewhere_is_applied(
        env: stack.Env) -> None:
    """1. A batch holds the reversal R1 of X1, not known yet: kept as a waiting orphan, the
    account locked, not committed. 2. Another batch holds X1 and waits for the account.
    3. R1 commits; X1 must be debited and credited back: 100.00, R1 applied."""
    account = f"RACE-{uuid.uuid4().hex[:6]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    orphan, decided = _decided_while_the_other_waits(
        env, authorization("R1", account, "10.00", "REVERSAL", original="X1"),
        authorization("X1", account, "10.00", "PURCHASE"))
    assert orphan.orphan and decided.result == "APPROVED"
    [row] = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1", account)
    [orphan] = stack.fetch(env.dsn, "SELECT state, applied FROM orphan_reversals "
                                    "WHERE txn_id = 'R1'")
    assert (orphan["state"], orphan["applied"]) == ("APPLIED", Decimal("10.00"))
    assert row["balance"] == Decimal("100.00")


def test_a_clearing_kept_while_its_hold_is_decided_elsewhere_is_netted(
        env: stack.Env) -> None:
    """The same race for a clearing before its hold: 1. a batch holds the final clearing C1
    of H1, not known yet: posted, kept as an early clearing, the account locked, not
    committed. 2. Another batch holds the authorization H1 and waits for the account.
    3. C1 commits; H1 must find it: the hold placed net of it (nothing held, CLEARED by C1),
    not 30.00 held a second time for a purchase already posted."""
    account = f"RACE-{uuid.uuid4().hex[:6]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    clearing, hold = _decided_while_the_other_waits(
        env,
        authorization(f"C1-{account}", account, "30.00", "CLEARING", original=f"H1-{account}"),
        authorization(f"H1-{account}", account, "30.00", "AUTHORIZATION"))
    assert clearing.forced and hold.result == "APPROVED"
    [row] = stack.fetch(env.dsn, "SELECT balance, held FROM accounts WHERE account_id = $1",
                        account)
    [placed] = stack.fetch(env.dsn, "SELECT state, remaining, ended_by FROM holds "
                                    "WHERE txn_id = $1", f"H1-{account}")
    [early] = stack.fetch(env.dsn, "SELECT state FROM early_clearings WHERE txn_id = $1",
                          f"C1-{account}")
    assert (row["balance"], row["held"]) == (Decimal("70.00"), Decimal("0.00"))
    assert (placed["state"], placed["remaining"], placed["ended_by"]) == \
        ("CLEARED", Decimal("0"), f"C1-{account}")
    assert early["state"] == "APPLIED"


def test_a_clearing_kept_while_the_purchase_it_names_is_decided_elsewhere_is_voided(
        env: stack.Env) -> None:
    """The same race for a clearing that names a purchase: 1. a batch holds the clearing C1
    of X1, not known yet: posted, kept as an early clearing, the account locked, not
    committed. 2. Another batch, of the purchase X1 alone, waits for the account. 3. C1
    commits; the purchase's batch, choosing its route after the lock, must find C1 and
    void it (seen failing: the purchases route chosen, C1 left waiting)."""
    account = f"RACE-{uuid.uuid4().hex[:6]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    clearing, purchase = _decided_while_the_other_waits(
        env,
        authorization(f"C1-{account}", account, "30.00", "CLEARING", original=f"X1-{account}"),
        authorization(f"X1-{account}", account, "30.00", "PURCHASE"))
    assert clearing.forced and purchase.result == "APPROVED"
    [early] = stack.fetch(env.dsn, "SELECT state FROM early_clearings WHERE txn_id = $1",
                          f"C1-{account}")
    assert early["state"] == "VOID"


@pytest.mark.parametrize("twin", ["duplicate", "conflict", "duplicate, one at a time",
                                  "duplicate on a card with a limit, one at a time"])
def test_a_claim_lost_to_a_batch_still_open_costs_its_message_alone(env: stack.Env,
                                                                    twin: str) -> None:
    """1. A batch holds K of account A: A locked, K claimed, not committed. 2. Another batch
    holds P1, K, P2 (P1 and P2 of account B; K of A again, a duplicate sent to another
    partition, which waits for A; or of account C, a conflict, which waits for K's claim;
    or a duplicate beside a reversal whose original is unknown, a batch decided one message
    at a time, which counts K's card's limit before it claims K). 3. The first commits: the
    second answers K lost, nothing of it written, and decides the rest in the same call,
    once."""
    b, c = (f"RACE-{uuid.uuid4().hex[:6]}" for _ in range(2))
    asyncio.run(stack.seed_accounts(env.dsn, [(x, "100.00", "EUR") for x in (b, c)]))
    a, card = _a_card(env, "100.00")
    if "limit" in twin:
        stack.fetch(env.dsn, "INSERT INTO spending_limits (limit_id, scope, scope_id, period, "
                             "max_amount) VALUES ($1, 'CARD', $2, 'DAY', 90) RETURNING 1",
                    f"L-{a}", card)  # (room for K twice: counted again, were it decided again)
    k = f"K-{a}"
    on_card = card if "limit" in twin else None

    async def decide_waiting() -> list[str]:
        store = await PostgresStore.connect(env.dsn)
        try:
            orphan = [authorization(f"R-{b}", b, "5.00", "REVERSAL", original=f"X-{b}")
                      ] if twin.endswith("at a time") else []
            batch = [authorization(f"P1-{b}", b, "10.00"),
                     _purchase(k, c if twin == "conflict" else a, "30.00", on_card),
                     *orphan, authorization(f"P2-{b}", b, "20.00")]
            decided = await store.authorize(
                batch, source_topic="t", source_partitions=[2] * len(batch),
                source_offsets=list(range(len(batch))))
            return [d.transaction_id for d in decided]
        finally:
            await store.close()

    held, decided, _ = command_while_a_batch_decides(
        env, _purchase(k, a, "30.00", on_card), decide_waiting, [])
    assert held.result == "APPROVED"
    assert decided == [f"P1-{b}", *([f"R-{b}"] if twin.endswith("at a time") else []),
                       f"P2-{b}"]
    balances = {r["account_id"]: r["balance"] for r in stack.fetch(
        env.dsn, "SELECT account_id, balance FROM accounts WHERE account_id = ANY($1::text[])",
        [a, b, c])}
    assert balances == {a: Decimal("70.00"), b: Decimal("70.00"), c: Decimal("100.00")}
    claims = stack.fetch(env.dsn, "SELECT source_partition, account_id FROM "
                                  "processed_transactions WHERE txn_id = $1", k)
    entries = stack.fetch(env.dsn, "SELECT account_id FROM ledger_entries WHERE txn_id = $1", k)
    assert [(r["source_partition"], r["account_id"]) for r in claims] == [(1, a)]
    assert [r["account_id"] for r in entries] == [a]
    if "limit" in twin:
        [usage] = stack.fetch(env.dsn, "SELECT amount, count FROM limit_usage "
                                       "WHERE limit_id = $1", f"L-{a}")
        assert (usage["amount"], usage["count"]) == (Decimal("30.00"), 1)


def test_orphans_and_their_purchases_decided_at_once_by_two_stores(env: stack.Env) -> None:
    """Two stores (two workers' pools), one deciding reversals of purchases it has not seen,
    the other the purchases, 300 accounts each with one of each, in batches racing each
    other: every reversal ends applied, every balance back where it was."""
    accounts = [f"RB-{uuid.uuid4().hex[:6]}-{i}" for i in range(300)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "50.00", "EUR") for a in accounts]))

    async def scenario() -> None:
        reversals_store = await PostgresStore.connect(env.dsn)
        purchases_store = await PostgresStore.connect(env.dsn)
        try:
            for start in range(0, len(accounts), 30):
                chunk = accounts[start:start + 30]
                await asyncio.gather(
                    reversals_store.authorize(
                        [authorization(f"R-{a}", a, "20.00", "REVERSAL", original=f"X-{a}")
                         for a in chunk],
                        source_topic="t", source_partitions=[1] * len(chunk),
                        source_offsets=list(range(len(chunk)))),
                    purchases_store.authorize(
                        [authorization(f"X-{a}", a, "20.00", "PURCHASE") for a in chunk],
                        source_topic="t", source_partitions=[2] * len(chunk),
                        source_offsets=list(range(len(chunk)))))
        finally:
            await reversals_store.close()
            await purchases_store.close()

    asyncio.run(scenario())
    waiting = stack.fetch(env.dsn, "SELECT txn_id FROM orphan_reversals WHERE state <> 'APPLIED'")
    off = stack.fetch(env.dsn, "SELECT account_id, balance FROM accounts "
                               "WHERE account_id = ANY($1::text[]) AND balance <> 50", accounts)
    assert waiting == [] and off == []


def test_two_purchases_of_one_card_only_one_fitting_its_limit_one_approved(
        env: stack.Env) -> None:
    """Two batches (two partitions) each with a purchase of the same card, the card's daily
    limit room for one: 1. the first batch decides (counted to the limit), its account
    locked, not committed. 2. The second waits for the account, then reads the usage the
    first committed: declined LIMIT_EXCEEDED, never both approved."""
    account, card = _a_card(env, "100.00")
    stack.fetch(env.dsn, "INSERT INTO spending_limits (limit_id, scope, scope_id, period, "
                         "max_amount) VALUES ($1, 'CARD', $2, 'DAY', 50) RETURNING 1",
                f"L-{account}", card)
    first, second = _decided_while_the_other_waits(
        env, _on_card("P1", account, card, "30.00"), _on_card("P2", account, card, "30.00"))
    assert (first.result, second.result, second.decline_reason, second.limit_id) == \
        ("APPROVED", "DECLINED", "LIMIT_EXCEEDED", f"L-{account}")
    [usage] = stack.fetch(env.dsn, "SELECT amount, count FROM limit_usage WHERE limit_id = $1",
                          f"L-{account}")
    assert (usage["amount"], usage["count"]) == (Decimal("30.00"), 1)


def test_a_card_frozen_while_a_batch_decides_for_its_account_waits_for_it(
        env: stack.Env) -> None:
    """`payauth cards status` reads the card's account without a lock, then takes the
    account's lock as a batch does: 1. a batch decides a purchase of the card (ACTIVE), its
    account locked, not committed. 2. The freeze waits for that lock. 3. The batch commits;
    the freeze then commits, and the next purchase is declined CARD_BLOCKED: the change
    applies to what is decided after it, never to a batch under way (seen not waiting with
    the account's lock removed from the command)."""
    account, card = _a_card(env, "100.00")
    first, said, [after] = command_while_a_batch_decides(
        env, _on_card("P1", account, card, "10.00"),
        lambda: cards.change_status(env.dsn, card, "FROZEN", "lost", by="test"),
        [_on_card("P2", account, card, "10.00")])
    assert "ACTIVE -> FROZEN" in said
    assert (first.result, after.result, after.decline_reason, after.card_status) == \
        ("APPROVED", "DECLINED", "CARD_BLOCKED", "FROZEN")


def test_a_limit_loaded_while_a_batch_decides_for_its_account_waits_for_it(
        env: stack.Env) -> None:
    """`payauth limits load` reads the card's owner without a lock, then takes the account's
    lock as a batch does: 1. a batch decides a purchase of 60 on the card (no limit yet),
    its account locked, not committed. 2. The load of a daily limit of 100 waits for that
    lock. 3. The batch commits (nothing counted: no limit when it read them); the load
    commits; the next purchase of 60 counts from 0 and fits, a third is declined
    LIMIT_EXCEEDED (seen not waiting with the account's lock removed from the command)."""
    account, card = _a_card(env, "1000.00")
    rows = limits.parse(f"LIM-{account},CARD,{card},DAY,100.00,\n")
    first, said, after = command_while_a_batch_decides(
        env, _on_card("P1", account, card, "60.00"), lambda: limits.load(env.dsn, rows),
        [_on_card("P2", account, card, "60.00"), _on_card("P3", account, card, "60.00")])
    assert said.startswith("limits: 1 new")
    assert first.result == "APPROVED"
    assert [(r.result, r.decline_reason, r.limit_id) for r in after] == [
        ("APPROVED", None, None), ("DECLINED", "LIMIT_EXCEEDED", f"LIM-{account}")]
    [usage] = stack.fetch(env.dsn, "SELECT amount, count FROM limit_usage WHERE limit_id = $1",
                          f"LIM-{account}")
    assert (usage["amount"], usage["count"]) == (Decimal("60.00"), 1)


async def _by_hand(dsn: str, statement: str, *args: Any, replaying: bool = False) -> str:
    """A statement run by hand, as the database's owner (a bank's own tool, psql); or, with
    ``replaying``, as a logical replication subscription applies a change
    (session_replication_role = replica: a core system's feed of its cards and accounts)."""
    conn = await asyncpg.connect(dsn)
    try:
        if replaying:
            await conn.execute("SET session_replication_role = replica")
        return str(await conn.execute(statement, *args))
    finally:
        await conn.close()


@pytest.mark.parametrize(("statement", "reason"), [
    ("INSERT INTO card_blocks (scope, scope_id, kind, value) "
     "VALUES ('CARD', $1, 'CATEGORY', '5411')", "CATEGORY_BLOCKED"),
    ("INSERT INTO card_blocks (scope, scope_id, kind, value) "
     "SELECT 'ACCOUNT', account_id, 'CATEGORY', '5411' FROM cards WHERE card_id = $1",
     "CATEGORY_BLOCKED"),
    ("UPDATE cards SET status = 'FROZEN' WHERE card_id = $1", "CARD_BLOCKED"),
    ("INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_count) "
     "VALUES ('LIM-' || $1, 'CARD', $1, 'DAY', 0)", "LIMIT_EXCEEDED"),
])
@pytest.mark.parametrize("replaying", [False, True], ids=["by hand", "replicated"])
def test_a_control_written_by_hand_while_a_batch_decides_waits_for_it(
        env: stack.Env, statement: str, reason: str, replaying: bool) -> None:
    """The controls written by hand (a bank's own tool may write a block, a status or a
    limit itself, as the contract allows), or applied by a logical replication subscription,
    take the locks of the accounts they concern, as the commands do (a trigger, one that
    fires in a replica session too): 1. a batch decides a purchase on the card (5411,
    nothing blocks it), its account locked, not committed. 2. The write waits for that lock.
    3. The batch commits, approved; the write commits, and the next purchase is declined by
    it (seen not waiting, and committed while the batch was open, without the trigger; and
    so when replicated, with the trigger an ordinary one)."""
    account, card = _a_card(env, "100.00")
    first, said, [after] = command_while_a_batch_decides(
        env, _on_card("P1", account, card, "10.00"),
        lambda: _by_hand(env.dsn, statement, card, replaying=replaying),
        [_on_card("P2", account, card, "10.00")])
    assert said.endswith(" 1")
    assert (first.result, after.result, after.decline_reason) == \
        ("APPROVED", "DECLINED", reason)


def test_a_card_block_written_while_its_card_moves_locks_the_account_it_moved_to(
        env: stack.Env) -> None:
    """A block of a card reads which account the card is of: 1. the card is moved by hand
    from A to B, not committed. 2. A block of the card is written by hand: it waits for the
    move. 3. The move commits; the block then takes B's lock, the card's account now (seen
    taking A's, the account it read before the move, with the card read unlocked: a batch
    deciding for B would not have waited for the block)."""
    a, b = f"MOVE-A-{uuid.uuid4().hex[:6]}", f"MOVE-B-{uuid.uuid4().hex[:6]}"
    card = f"CARD-{a}"
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "10.00", "EUR"), (b, "10.00", "EUR")]))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ($1, $2) RETURNING 1",
                card, a)

    async def scenario() -> None:
        mover, blocker, other = [await asyncpg.connect(env.dsn) for _ in range(3)]
        try:
            async with mover.transaction():
                await mover.execute("UPDATE cards SET account_id = $1 WHERE card_id = $2",
                                    b, card)
                blocking = blocker.transaction()
                await blocking.start()
                block = asyncio.create_task(blocker.execute(
                    "INSERT INTO card_blocks (scope, scope_id, kind, value) "
                    "VALUES ('CARD', $1, 'CATEGORY', '7995')", card))
                await stack.until_a_lock_is_awaited(env.dsn)  # the block, for the move
            await block  # written, not committed: the locks it took are held
            with pytest.raises(asyncpg.LockNotAvailableError):
                await other.execute("SELECT 1 FROM accounts WHERE account_id = $1 "
                                    "FOR UPDATE NOWAIT", b)
            await blocking.rollback()
        finally:
            for conn in (mover, blocker, other):
                await conn.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["REVERSAL", "INCREMENTAL"])
def test_a_batch_never_waits_for_a_hold_of_an_account_it_has_not_locked(
        env: stack.Env, kind: str) -> None:
    """1. A batch of account B clears B's hold and stays open (the hold locked). 2. A batch
    of account A places a hold and reverses (or increments) B's hold by mistake: it locks
    only A, so it must not wait for B's hold either (two such batches, each naming the
    other's holds, would deadlock); the reversal is answered as a mismatch, the increment
    declined HOLD_NOT_ACTIVE (the loop's answers, from the hold as last committed), while
    the first batch is still open."""
    asyncio.run(stack.seed_accounts(env.dsn, [("RACE-A", "100.00", "EUR"),
                                              ("RACE-B", "100.00", "EUR")]))
    run = uuid.uuid4().hex[:6]
    held_b = authorization(f"HB-{run}", "RACE-B", "10.00", kind="AUTHORIZATION")

    async def scenario() -> tuple[Any, Any]:
        holding = await HeldOpenStore.connect(env.dsn)
        other = await PostgresStore.connect(env.dsn)
        try:
            await stack.authorize_in_order(other, [held_b])
            first = asyncio.create_task(holding.authorize(
                [authorization(f"CB-{run}", "RACE-B", "10.00", kind="CLEARING",
                               original=held_b.transaction_id)],
                source_topic="t", source_partitions=[0], source_offsets=[0]))
            await asyncio.wait_for(holding.decided.wait(), 10)
            second = await asyncio.wait_for(stack.authorize_in_order(other, [
                authorization(f"HA-{run}", "RACE-A", "1.00", kind="AUTHORIZATION"),
                authorization(f"RA-{run}", "RACE-A", "1.00", kind=kind,
                              original=held_b.transaction_id)]), 10)
            assert not first.done()  # B's batch still open, its hold still locked
            holding.release.set()
            return await first, second
        finally:
            await holding.close()
            await other.close()

    [cleared], [placed, named] = asyncio.run(scenario())
    assert not cleared.forced and placed.result.value == "APPROVED"
    if kind == "REVERSAL":
        assert named.mismatch is not None and "another account" in named.mismatch
    else:
        assert named.decline_reason is not None
        assert named.decline_reason.value == "HOLD_NOT_ACTIVE"


_PAUSE_KEY = 4_113_001  # the advisory lock the wrapped payauth_mismatch waits on


def _mismatch_pauses_after_asking(env: stack.Env, original: str) -> None:
    """``payauth_mismatch``, asked of ``original``, answers as shipped and then waits for the
    test's advisory lock: whatever commits meanwhile, the batch asking has seen nothing of."""
    stack.fetch(env.dsn, """
        ALTER FUNCTION payauth_mismatch(text, text, text, numeric, text, numeric, text)
              RENAME TO payauth_mismatch_as_shipped""")
    stack.fetch(env.dsn, f"""
        CREATE FUNCTION payauth_mismatch(k text, a text, c text, n numeric, bc text,
                                         bn numeric, o text) RETURNS text
        LANGUAGE plpgsql AS $$
        DECLARE why text := payauth_mismatch_as_shipped(k, a, c, n, bc, bn, o);
        BEGIN
            IF o = '{original}' THEN
                PERFORM pg_advisory_xact_lock({_PAUSE_KEY});
            END IF;
            RETURN why;
        END $$""")


@pytest.mark.parametrize("kind,original_kind", [("REVERSAL", "AUTHORIZATION"),
                                                ("REVERSAL", "PURCHASE"),
                                                ("CLEARING", "AUTHORIZATION")])
def test_an_original_of_another_account_decided_meanwhile_moves_nothing_of_it(
        env: stack.Env, kind: str, original_kind: str) -> None:
    """1. A batch of account A (a hold of its own active) decides a REVERSAL or CLEARING of
    X, not known yet: payauth_mismatch finds nothing to refuse. 2. Before that batch reads
    X itself, another batch commits X on account B. 3. The first batch goes on: it must not
    release B's hold nor credit A with B's purchase (X is of another account); every
    invariant of ``payauth verify`` holds after both."""
    run = uuid.uuid4().hex[:6]
    a, b = f"RACE-A-{run}", f"RACE-B-{run}"
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "100.00", "EUR"), (b, "100.00", "EUR")]))
    x = authorization(f"X-{run}", b, "10.00", kind=original_kind)
    _mismatch_pauses_after_asking(env, x.transaction_id)

    async def scenario() -> tuple[Any, Any]:
        pausing = await asyncpg.connect(env.dsn)
        first_store = await PostgresStore.connect(env.dsn)
        other = await PostgresStore.connect(env.dsn)
        try:
            await stack.authorize_in_order(other, [
                authorization(f"HA-{run}", a, "50.00", kind="AUTHORIZATION")])
            await pausing.execute("SELECT pg_advisory_lock($1)", _PAUSE_KEY)
            first = asyncio.create_task(stack.authorize_in_order(first_store, [
                authorization(f"N-{run}", a, "10.00", kind=kind,
                              original=x.transaction_id)]))
            await stack.until_a_lock_is_awaited(env.dsn)  # asked, and paused
            [placed] = await asyncio.wait_for(stack.authorize_in_order(other, [x]), 10)
            assert not first.done()
            await pausing.execute("SELECT pg_advisory_unlock($1)", _PAUSE_KEY)
            [named] = await asyncio.wait_for(first, 10)
            return placed, named
        finally:
            await pausing.close()
            await first_store.close()
            await other.close()

    placed, named = asyncio.run(scenario())
    assert placed.result.value == "APPROVED"
    assert named.mismatch is None  # what it saw: X not known yet
    [b_row] = stack.fetch(env.dsn, "SELECT balance, held FROM accounts WHERE account_id = $1", b)
    debited = Decimal("10.00") if original_kind == "PURCHASE" else Decimal("0")
    assert (b_row["balance"], b_row["held"]) == (Decimal("100.00") - debited,
                                                 Decimal("10.00") - debited)
    text, ok = report(asyncio.run(verify(env.dsn)))
    assert ok, text
    assert stack.fetch(env.dsn, "SELECT amount_applied FROM lifecycle_messages "
                                "WHERE txn_id = $1", named.transaction_id
                       )[0]["amount_applied"] in (None, Decimal("0"))


@pytest.mark.parametrize("replaying", [False, True], ids=["loaded", "replicated"])
def test_an_account_added_while_a_batch_decides_it_unknown_waits_for_that_batch(
        env: stack.Env, replaying: bool) -> None:
    """1. A batch keeps the reversal R of P for account Y, not there yet (an orphan), and
    stays open. 2. `payauth accounts load` adds Y (or a logical replication subscription
    applies its row, in a replica session): it must wait for that batch, or the batch that
    decides P on Y could miss R (the customer never credited). 3. P, decided after, applies
    R: Y's balance back where it was (replicated: seen not waiting with the fence's trigger
    an ordinary one)."""
    run = uuid.uuid4().hex[:6]
    y = f"RACE-Y-{run}"
    reversal = authorization(f"R-{run}", y, "10.00", kind="REVERSAL", original=f"P-{run}")

    async def load_y() -> Any:
        if replaying:
            return await _by_hand(env.dsn, "INSERT INTO accounts (account_id, balance, "
                                  "currency) VALUES ($1, 100.00, 'EUR')", y, replaying=True)
        return await accounts.load(env.dsn, [accounts.AccountRow(1, y, Decimal("100.00"),
                                                                 "EUR", "ACTIVE")])

    kept, loaded, [purchase] = command_while_a_batch_decides(
        env, reversal, load_y, [authorization(f"P-{run}", y, "10.00")])
    assert kept.orphan and (loaded == "INSERT 0 1" if replaying else loaded.new == [y])
    assert purchase.result.value == "APPROVED"
    [row] = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1", y)
    assert row["balance"] == Decimal("100.00")  # debited 10.00, credited back by R
    text, ok = report(asyncio.run(verify(env.dsn)))
    assert ok, text


def test_a_batch_naming_an_account_being_added_waits_for_it_then_is_retried(
        env: stack.Env) -> None:
    """1. An insert into accounts adds Y and stays open. 2. A batch with a purchase on Y (and
    one on an account already there) must wait for it, not decide Y unknown and then find
    it, unlocked, in a later read. 3. The insert commits: the batch is refused as a
    transient error (locking Y now would be out of order), and the retry, which locks Y in
    order, approves the purchase on Y."""
    run = uuid.uuid4().hex[:6]
    y, x = f"RACE-Y-{run}", f"RACE-X-{run}"
    asyncio.run(stack.seed_accounts(env.dsn, [(x, "100.00", "EUR")]))

    async def scenario() -> list[Any]:
        adding = await asyncpg.connect(env.dsn)
        store = await PostgresStore.connect(env.dsn)
        try:
            tx = adding.transaction()
            await tx.start()
            await adding.execute("INSERT INTO accounts (account_id, balance, currency) "
                                 "VALUES ($1, 100.00, 'EUR')", y)
            deciding = asyncio.create_task(stack.authorize_in_order(store, [
                authorization(f"PX-{run}", x, "10.00"), authorization(f"PY-{run}", y, "80.00")]))
            await stack.until_a_lock_is_awaited(env.dsn)
            assert not deciding.done()
            await tx.commit()
            with pytest.raises(TransientError):
                await asyncio.wait_for(deciding, 10)
            return await stack.authorize_in_order(store, [
                authorization(f"PX-{run}", x, "10.00"), authorization(f"PY-{run}", y, "80.00")])
        finally:
            await adding.close()
            await store.close()

    on_x, on_y = asyncio.run(scenario())
    assert on_x.result.value == "APPROVED" and on_y.result.value == "APPROVED"
    [row] = stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1", y)
    assert row["balance"] == Decimal("20.00")


def test_a_role_that_may_insert_accounts_takes_the_fence_whatever_its_grants(
        env: stack.Env) -> None:
    """The fence's trigger runs as its owner: a loader role with INSERT on accounts alone
    (no grant on the fence's function) adds an account."""
    role = f"payauth_loader_{uuid.uuid4().hex[:8]}"
    account = f"RACE-L-{uuid.uuid4().hex[:6]}"
    stack.fetch(env.dsn, f"CREATE ROLE {role} NOLOGIN")
    try:
        stack.fetch(env.dsn, f"GRANT INSERT ON accounts TO {role}")

        async def insert_as_loader() -> None:
            conn = await asyncpg.connect(env.dsn)
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL ROLE {role}")
                    await conn.execute("INSERT INTO accounts (account_id, balance, currency) "
                                       "VALUES ($1, 5.00, 'EUR')", account)
            finally:
                await conn.close()

        asyncio.run(insert_as_loader())
        assert stack.fetch(env.dsn, "SELECT balance FROM accounts WHERE account_id = $1",
                           account)[0]["balance"] == Decimal("5.00")
    finally:
        stack.fetch(env.dsn, f"REVOKE ALL ON accounts FROM {role}")
        stack.fetch(env.dsn, f"DROP ROLE {role}")
