"""The lifecycle's rules at the edges of the purchase path (sql/payauth_authorize_each.sql):
an orphan reversal of a PURCHASE applied when the purchase arrives, whether it comes in a
batch of its own or with its orphans; the reversals and clearings that came before their
hold applied in the order they came; an ADVICE or CLEARING that cannot be netted against
its account dead-lettered, never declined. Through a real worker, checked in the database
and on the topics."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path

import asyncpg

from service.adapters.postgres import PostgresStore
from service.domain.events import encode_event, events_of
from service.domain.messages import Authorization, decode_authorization
from service.ops.migrate import migrate
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.factory import encode
from tests.support.workers import payauth


def test_an_orphan_reversal_of_a_purchase_is_credited_when_it_arrives(env,
                                                                     spawn_worker) -> None:
    t = lc.names("buy", "orph1", "orph2", "later", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    worker = lc.run(env, spawn_worker, [
        lc.msg(t["orph1"], "REVERSAL", acc, "30.00", t["buy"]),  # before its purchase
        lc.msg(t["orph2"], "REVERSAL", acc, "50.00", t["buy"]),  # only 10 will be left
    ])
    assert stack.fetch(env.dsn, "SELECT count(*) AS n FROM orphan_reversals "
                                "WHERE state = 'WAITING'")[0]["n"] == 2
    # The purchase alone in its batch: the purchase statement finds the orphans waiting.
    lc.send_more(env, [lc.msg(t["buy"], "PURCHASE", acc, "40.00")])
    lc.send_more(env, [lc.msg(t["later"], "REVERSAL", acc, "5.00", t["buy"])])  # nothing left
    assert lc.ledger(env, acc) == [(t["buy"], "PURCHASE", Decimal("-40.00")),
                                   (t["orph1"], "REVERSAL", Decimal("30.00")),
                                   (t["orph2"], "REVERSAL", Decimal("10.00"))]
    assert lc.balances(env, acc) == (Decimal("100.00"), 0, Decimal("100.00"))
    orphans = stack.fetch(env.dsn, "SELECT txn_id, state, applied FROM orphan_reversals")
    assert {r["txn_id"]: (r["state"], r["applied"]) for r in orphans} == {
        t["orph1"]: ("APPLIED", Decimal("30.00")), t["orph2"]: ("APPLIED", Decimal("10.00"))}
    events = lc.events(env, expect=6)
    assert events[t["buy"]]["event_type"] == "PaymentAuthorized"
    assert events[t["buy"]]["balance_delta"] == "-40.00"  # its own effect only
    assert [(events[lc.applied(r)]["amount_applied"], events[lc.applied(r)]["balance_delta"])
            for r in (t["orph1"], t["orph2"])] == [("30.00", "30.00"), ("10.00", "10.00")]
    assert events[t["later"]]["amount_applied"] == "0.00"
    lc.verified(env)
    shown = payauth(env, "explain", t["orph1"])
    assert shown.returncode == 0 and "APPLIED" in shown.stdout, shown.stdout
    assert worker.alive()


def test_an_orphan_reversal_and_its_purchase_in_one_batch(env, spawn_worker) -> None:
    t = lc.names("buy", "orph", "declined", "orph_d", "refund", "orph_r", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["orph"], "REVERSAL", acc, "100.00", t["buy"]),  # more than the purchase
        lc.msg(t["orph_d"], "REVERSAL", acc, "10.00", t["declined"]),
        lc.msg(t["orph_r"], "REVERSAL", acc, "1.00", t["refund"]),
        lc.msg(t["buy"], "PURCHASE", acc, "25.00"),
        lc.msg(t["declined"], "PURCHASE", acc, "1000.00"),  # declined: its orphan is void
        lc.msg(t["refund"], "REFUND", acc, "2.00"),  # a refund is never reversed
    ])
    assert lc.ledger(env, acc) == [(t["buy"], "PURCHASE", Decimal("-25.00")),
                                   (t["orph"], "REVERSAL", Decimal("25.00")),
                                   (t["refund"], "REFUND", Decimal("2.00"))]
    assert lc.balances(env, acc) == (Decimal("102.00"), 0, Decimal("102.00"))
    orphans = stack.fetch(env.dsn, "SELECT txn_id, state, applied FROM orphan_reversals")
    assert {r["txn_id"]: (r["state"], r["applied"]) for r in orphans} == {
        t["orph"]: ("APPLIED", Decimal("25.00")), t["orph_d"]: ("VOID", 0),
        t["orph_r"]: ("VOID", 0)}
    lc.verified(env)


def test_what_waited_for_a_hold_is_applied_in_the_order_it_came(env, spawn_worker,
                                                                tmp_path) -> None:
    """A clearing and a reversal, both before the hold they name, are applied when it comes
    in the order they came, as if it had been there: a final clearing first ends the hold,
    and the reversal after it releases nothing and gives nothing back to the card's limit
    (the money was spent); a clearing of 30 first, then a reversal of all, releases 30 and
    70, and the limit gets 70 back, keeping the count (the hold was cleared in part). Seen
    failing with every orphan reversal applied before every clearing: each reversal
    released its 100, each clearing nothing."""
    t = lc.names("h1", "c1", "r1", "h2", "c2", "r2", "acc", "card", "lim")
    acc, card = t["acc"], t["card"]
    lc.seed(env, (acc, "1000.00"))
    lc.controls(env, tmp_path, [f"{card},{acc}"], [f"{t['lim']},CARD,{card},DAY,900.00,10"])
    lc.run(env, spawn_worker, [
        lc.msg(t["c1"], "CLEARING", acc, "100.00", t["h1"], final=True, card_id=card),
        lc.msg(t["r1"], "REVERSAL", acc, "100.00", t["h1"], card_id=card),
        lc.msg(t["c2"], "CLEARING", acc, "30.00", t["h2"], final=False, card_id=card),
        lc.msg(t["r2"], "REVERSAL", acc, "100.00", t["h2"], card_id=card),
        lc.msg(t["h1"], "AUTHORIZATION", acc, "100.00", card_id=card),
        lc.msg(t["h2"], "AUTHORIZATION", acc, "100.00", card_id=card)])
    lc.events(env, expect=8)  # six decisions, and a ReversalApplied per orphan
    assert (lc.hold(env, t["h1"])["state"], lc.hold(env, t["h1"])["ended_by"]) == \
        ("CLEARED", t["c1"])
    assert (lc.hold(env, t["h2"])["state"], lc.hold(env, t["h2"])["remaining"]) == \
        ("REVERSED", 0)
    waited = stack.fetch(env.dsn, "SELECT txn_id, applied FROM orphan_reversals "
                                  "UNION ALL SELECT txn_id, applied FROM early_clearings")
    assert {r["txn_id"]: r["applied"] for r in waited} == {
        t["c1"]: Decimal("100.00"), t["r1"]: 0, t["c2"]: Decimal("30.00"),
        t["r2"]: Decimal("70.00")}
    usage = stack.fetch(env.dsn, "SELECT amount, count FROM limit_usage WHERE limit_id = $1",
                        t["lim"])
    assert [(r["amount"], r["count"]) for r in usage] == [(Decimal("130.00"), 2)]
    assert lc.balances(env, acc)[0] == Decimal("870.00")  # both clearings posted
    lc.verified(env)


def test_the_upgrade_numbers_what_waits_in_the_order_it_was_applied_before(
        live_stack: None, tmp_path: Path) -> None:
    """A database at migration 027 with reversals and clearings kept for their originals
    (two of one batch, sharing arrived_at); the upgrade numbers them by arrived_at, an
    orphan reversal before a clearing of the same time, then by transaction_id (the orphan
    reversals among themselves as they were applied before it), and a reversal kept after
    it, as the worker's role keeps it, comes after them all."""
    database, dsn = asyncio.run(stack.database_before("028", tmp_path))

    async def scenario() -> list[str]:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO orphan_reversals (txn_id, original_txn_id, account_id, currency, "
                "amount, state, arrived_at) VALUES "
                "('R-B', 'H', 'ACC', 'EUR', 1, 'WAITING', '2026-01-01 10:00'), "
                "('R-A', 'H', 'ACC', 'EUR', 1, 'WAITING', '2026-01-01 11:00')")
            await conn.execute(
                "INSERT INTO early_clearings (txn_id, original_txn_id, account_id, currency, "
                "amount, final, state, arrived_at) VALUES "
                "('C-A', 'H', 'ACC', 'EUR', 1, false, 'WAITING', '2026-01-01 10:00'), "
                "('C-B', 'H', 'ACC', 'EUR', 1, true, 'WAITING', '2026-01-01 09:00')")
            await migrate(dsn)
            await conn.execute("SET ROLE payauth_worker")
            await conn.execute(
                "INSERT INTO orphan_reversals (txn_id, original_txn_id, account_id, currency, "
                "amount, state, arrived_at) VALUES "
                "('R-0', 'H', 'ACC', 'EUR', 1, 'WAITING', '2025-01-01')")
            return [r["txn_id"] for r in await conn.fetch(
                "SELECT txn_id, arrival FROM orphan_reversals UNION ALL "
                "SELECT txn_id, arrival FROM early_clearings ORDER BY arrival")]
        finally:
            await conn.close()

    try:
        assert asyncio.run(scenario()) == ["C-B", "R-B", "C-A", "R-A", "R-0"]
    finally:
        asyncio.run(stack.drop_database(database))


def test_an_advice_or_clearing_that_cannot_be_netted_is_dead_lettered(env,
                                                                     spawn_worker) -> None:
    t = lc.names("adv_usd", "clr_usd", "clr_nobody", "adv_nobody", "hold", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "100.00"))
    lc.run(env, spawn_worker, [
        lc.msg(t["adv_usd"], "ADVICE", acc, "10.00", currency="USD"),
        lc.msg(t["clr_usd"], "CLEARING", acc, "10.00", currency="USD"),  # forced, in USD
        lc.msg(t["clr_nobody"], "CLEARING", "NO-SUCH-ACCOUNT", "10.00"),
        lc.msg(t["adv_nobody"], "ADVICE", "NO-SUCH-ACCOUNT", "10.00"),
        lc.msg(t["hold"], "AUTHORIZATION", acc, "1.00"),  # the partition goes on
    ])
    letters = lc.dead_letters(env, expect=3)
    assert [reason for reason, _ in letters] == ["LIFECYCLE_MISMATCH"] * 3
    details = " | ".join(detail for _, detail in letters)
    assert f"the account {acc} is in EUR" in details, details
    assert "the account NO-SUCH-ACCOUNT is unknown" in details, details
    events = lc.events(env, expect=2)
    # An advice of an unknown account is the one decline the contract gives an advice.
    assert (events[t["adv_nobody"]]["result"], events[t["adv_nobody"]]["decline_reason"]) == \
        ("DECLINED", "UNKNOWN_ACCOUNT")
    assert events[t["hold"]]["result"] == "APPROVED"
    assert lc.balances(env, acc) == (Decimal("100.00"), Decimal("1.00"), Decimal("99.00"))
    assert lc.ledger(env, acc) == []
    decided = stack.fetch(env.dsn, "SELECT txn_id FROM processed_transactions")
    assert {r["txn_id"] for r in decided} == {t["adv_nobody"], t["hold"]}
    lc.verified(env)


def test_a_republication_carries_what_the_first_publication_did(env) -> None:
    """Every event of a decision never confirmed published is published again the same, bytes
    and all, from what the store kept: the deltas of each kind and the orphans a decision
    applied, even after what came since wrote under the same transaction ids (an orphan
    reversal's credit is written under its id when its purchase arrives)."""
    t = lc.names("x", "rx", "h", "rh", "rh2", "c", "buy", "rbuy", "adv", "acc")
    acc = t["acc"]
    lc.seed(env, (acc, "500.00"))

    def auth(txn: str, kind: str, amount: str, original: str | None = None) -> Authorization:
        return decode_authorization(encode(lc.msg(txn, kind, acc, amount, original)))

    batches = [
        [auth(t["rx"], "REVERSAL", "4.00", t["x"]), auth(t["rh"], "REVERSAL", "3.00", t["h"])],
        [auth(t["x"], "PURCHASE", "10.00"), auth(t["h"], "AUTHORIZATION", "50.00")],
        [auth(t["rh2"], "REVERSAL", "5.00", t["h"]), auth(t["c"], "CLEARING", "60.00", t["h"]),
         auth(t["buy"], "PURCHASE", "20.00"), auth(t["rbuy"], "REVERSAL", "8.00", t["buy"]),
         auth(t["adv"], "ADVICE", "700.00")],
    ]

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        store = await PostgresStore.connect(env.dsn)
        try:
            first: list[bytes] = []
            for batch in batches:
                decided = await store.authorize(batch, source_topic="t",
                                                source_partitions=[0] * len(batch),
                                                source_offsets=list(range(len(batch))))
                first += [encode_event(e) for r in decided for e in events_of(r)]
            stored = await store.load_stored([a.transaction_id for b in batches for a in b])
            again = [encode_event(e) for b in batches for a in b
                     for e in events_of(stored[a.transaction_id])]
            return first, again
        finally:
            await store.close()

    first, again = asyncio.run(scenario())
    assert again == first
    applied = [json.loads(e) for e in first if b'"ReversalApplied"' in e]
    assert [(e["transaction_id"], e["balance_delta"], e["held_delta"]) for e in applied] == [
        (t["rx"], "4.00", "0.00"), (t["rh"], "0.00", "-3.00")]
    orphan = next(json.loads(e) for e in again if json.loads(e)["transaction_id"] == t["rx"]
                  and b"PaymentReversed" in e)
    assert (orphan["balance_delta"], orphan["held_delta"]) == ("0.00", "0.00")
