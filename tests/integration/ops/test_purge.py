"""``payauth purge`` (``service/adapters/retention.py`` through ``service/ops/purge.py``):
the window kept, older records deleted, and the ledger still guarding a purged one; the
spending limits' charges purged with their records, their usage kept."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import asyncpg

from service.adapters import retention
from service.adapters.postgres import PostgresStore
from service.domain.messages import decode_authorization
from service.ops.migrate import migrate
from service.ops.verify import report, verify
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.held_open import HeldOpenStore
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


def test_purge_takes_the_limits_charges_with_their_records_and_keeps_the_usage(
        env) -> None:
    """Two purchases on a card with a daily and a monthly limit; the first's record set 100 h
    back, and a daily usage row of a period over ten days ago whose charges were purged: the
    purge takes the first's two charges with its record and keeps what they counted
    (purged_limit_charges), keeps the second's charges and every usage, today's still counting
    both (a reversal after the window gives nothing back: the limit only stricter; a message
    decided late may still count in the old period). `verify` holds every usage to its
    charges and what was purged, exactly: it passes, then finds a usage below them, one
    above them (a count twice in the old period: seen passing when a period older than the
    oldest record was held only to at least its charges), and one its charges do not
    make."""
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    card, day, month = f"CARD-{account}", f"LD-{account}", f"LM-{account}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ($1, $2) RETURNING 1",
                card, account)
    stack.fetch(env.dsn, "INSERT INTO spending_limits (limit_id, scope, scope_id, period, "
                         "max_amount) VALUES ($1, 'CARD', $3, 'DAY', 500), "
                         "($2, 'CARD', $3, 'MONTH', 5000) RETURNING 1", day, month, card)
    first, second = f"P1-{account}", f"P2-{account}"

    def stamped_now(txn: str) -> dict:
        message = auth_message(txn, account_id=account, amount="10.00", card_id=card)
        message["headers"]["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        return message

    async def decide() -> None:
        store = await PostgresStore.connect(env.dsn)
        try:
            await stack.authorize_in_order(store, [
                decode_authorization(encode(stamped_now(t))) for t in (first, second)])
        finally:
            await store.close()

    asyncio.run(decide())
    # (Each charge stamped with its record's period: the purge finds it by that period.)
    stamped = stack.fetch(env.dsn, "SELECT c.dedup_period = p.dedup_period AS same "
                                   "FROM limit_charges c JOIN processed_transactions p "
                                   "ON p.txn_id = c.charged_by WHERE c.txn_id = ANY($1)",
                          [first, second])
    assert [r["same"] for r in stamped] == [True] * 4
    stack.fetch(env.dsn, "UPDATE processed_transactions "
                         "SET processed_at = now() - interval '100 hours' WHERE txn_id = $1", first)
    stack.fetch(env.dsn, "INSERT INTO limit_usage (limit_id, period_start, amount, count) "
                         "VALUES ($1, current_date - 10, 70, 3) RETURNING 1", day)
    stack.fetch(env.dsn, "INSERT INTO purged_limit_charges (limit_id, period_start, amount, "
                         "count) VALUES ($1, current_date - 10, 70, 3) RETURNING 1", day)

    result = payauth(env, "purge")
    assert result.returncode == 0, result.stderr
    charges = sorted((r["txn_id"], r["limit_id"]) for r in stack.fetch(
        env.dsn, "SELECT txn_id, limit_id FROM limit_charges WHERE txn_id = ANY($1)",
        [first, second]))
    assert charges == sorted([(second, day), (second, month)])
    usage = {(r["limit_id"], r["old"]): (r["amount"], r["count"], r["purged_amount"],
                                          r["purged_count"]) for r in stack.fetch(
        env.dsn, "SELECT u.limit_id, u.period_start = current_date - 10 AS old, u.amount, "
                 "u.count, sum(p.amount) AS purged_amount, sum(p.count) AS purged_count "
                 "FROM limit_usage u JOIN purged_limit_charges p USING (limit_id, "
                 "period_start) WHERE u.limit_id = ANY($1) "
                 "GROUP BY u.limit_id, u.period_start, u.amount, u.count", [day, month])}
    assert usage == {(day, False): (Decimal("20.00"), 2, Decimal("10.00"), 1),
                     (month, False): (Decimal("20.00"), 2, Decimal("10.00"), 1),
                     (day, True): (Decimal("70"), 3, Decimal("70"), 3)}
    verified = payauth(env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

    stack.fetch(env.dsn, "UPDATE limit_usage SET amount = amount + 10, count = count + 1 "
                         "WHERE limit_id = $1 AND period_start = current_date - 10 RETURNING 1",
                day)
    above = payauth(env, "verify")
    assert above.returncode != 0 and "usage 80 / 4, charges 0 / 0, purged 70 / 3" \
        in above.stdout, above.stdout
    stack.fetch(env.dsn, "UPDATE limit_usage SET amount = amount - 10, count = count - 1 "
                         "WHERE limit_id = $1 AND period_start = current_date - 10 RETURNING 1",
                day)

    stack.fetch(env.dsn, "UPDATE limit_usage SET amount = 5 WHERE limit_id = $1 RETURNING 1",
                day)
    below = payauth(env, "verify")
    assert below.returncode != 0 and f"{day} " in below.stdout, below.stdout
    stack.fetch(env.dsn, "UPDATE limit_usage SET amount = 20 WHERE limit_id = $1 RETURNING 1",
                day)
    stack.fetch(env.dsn, "INSERT INTO limit_usage (limit_id, period_start, amount, count) "
                         "VALUES ($1, current_date + 2, 5, 1) RETURNING 1", day)
    uncharged = payauth(env, "verify")
    assert uncharged.returncode != 0 and "usage 5 / 1, charges 0 / 0, purged 0 / 0" \
        in uncharged.stdout, uncharged.stdout


def test_a_purge_never_waits_for_a_batch_counting_in_the_limits_it_purges(env) -> None:
    """1. A purchase on a card with a daily limit, its record then set 100 h back. 2. A batch
    decides a second purchase on the card, counting in the same limit and day, and stays
    open (its account and that usage row locked). 3. The purge takes the first's record and
    charge and keeps what it counted, without waiting for that batch (seen waiting for it,
    the worker's batches all held behind it in a soak, when the purge added what it took
    to the usage row itself). 4. The batch commits: the usage counts both, verify clean."""
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    card, day = f"CARD-{account}", f"LD-{account}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "1000.00", "EUR")]))
    stack.fetch(env.dsn, "INSERT INTO cards (card_id, account_id) VALUES ($1, $2) RETURNING 1",
                card, account)
    stack.fetch(env.dsn, "INSERT INTO spending_limits (limit_id, scope, scope_id, period, "
                         "max_amount) VALUES ($1, 'CARD', $2, 'DAY', 500) RETURNING 1",
                day, card)
    first, second = (decode_authorization(encode(auth_message(
        f"P{n}-{account}", account_id=account, amount="10.00", card_id=card)))
        for n in (1, 2))

    async def scenario() -> int:
        other = await PostgresStore.connect(env.dsn)
        holding = await HeldOpenStore.connect(env.dsn)
        purging = await asyncpg.connect(env.dsn)
        try:
            await stack.authorize_in_order(other, [first])
            await purging.execute("UPDATE processed_transactions SET processed_at = now() - "
                                  "interval '100 hours' WHERE txn_id = $1", first.transaction_id)
            deciding = asyncio.create_task(holding.authorize(
                [second], source_topic="t", source_partitions=[1], source_offsets=[0]))
            await asyncio.wait_for(holding.decided.wait(), 10)
            purged = await asyncio.wait_for(retention.purge(purging, retention_hours=72), 10)
            holding.release.set()
            await deciding
            return purged
        finally:
            holding.release.set()
            await purging.close()
            await holding.close()
            await other.close()

    assert asyncio.run(scenario()) == 1
    [usage] = stack.fetch(env.dsn, "SELECT amount, count FROM limit_usage WHERE limit_id = $1",
                          day)
    assert (usage["amount"], usage["count"]) == (Decimal("20.00"), 2)
    verified = payauth(env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_upgrade_keeps_as_purged_what_an_old_period_counts_beyond_its_charges(
        tmp_path) -> None:
    """A database as the release before migration 030 left it, no record kept (every period
    older than the oldest record, so held then only to at least its charges): a usage above
    its charges keeps the difference as purged, one with no charge left keeps all of it;
    one below its charges keeps nothing, and `verify` names it still."""
    database, dsn = asyncio.run(stack.database_before("030", tmp_path))

    async def scenario() -> tuple[dict, str, bool]:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO limit_usage (limit_id, period_start, amount, count) VALUES "
                "('L', current_date - 10, 70, 3), ('L', current_date - 11, 40, 2), "
                "('L', current_date - 12, 5, 1)")
            await conn.execute(
                "INSERT INTO limit_charges (txn_id, charged_by, limit_id, period_start, "
                "amount, count) VALUES ('P1', 'P1', 'L', current_date - 10, 20, 1), "
                "('P2', 'P2', 'L', current_date - 12, 6, 1), "
                "('P3', 'P3', 'L', current_date - 12, 4, 1)")
            await migrate(dsn)
            purged = {r["age"]: (r["amount"], r["count"]) for r in await conn.fetch(
                "SELECT current_date - period_start AS age, amount, count "
                "FROM purged_limit_charges")}
        finally:
            await conn.close()
        text, ok = report(await verify(dsn))
        return purged, text, ok

    try:
        purged, text, ok = asyncio.run(scenario())
    finally:
        asyncio.run(stack.drop_database(database))
    assert purged == {10: (Decimal("50"), 2), 11: (Decimal("40"), 2)}
    failed = [line for line in text.splitlines() if line.startswith("FAIL")]
    assert not ok and len(failed) == 1 and "usage 5 / 1, charges 10 / 2, purged 0 / 0" \
        in failed[0], text


def test_the_purge_compiles_nothing_just_in_time(env) -> None:
    """The purge's row-by-row statements are costed far above the rows they touch (their
    WITHs join the charges of every period): on a store of millions, PostgreSQL JIT-compiled
    each for seconds of CPU at every purge. Costed as on such a store (JIT from cost 0),
    the purge's connection plans them without (seen failing: a JIT section in the plan)."""
    async def plan_after_a_purge() -> str:
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET jit_above_cost = 0")
            await retention.purge(conn, retention_hours=72)
            return "\n".join(r[0] for r in await conn.fetch(
                "EXPLAIN " + retention._DELETE_SET_BACK, 72.0, 5000))
        finally:
            await conn.close()

    plan = asyncio.run(plan_after_a_purge())
    assert "Delete on processed_transactions" in plan and "JIT" not in plan


def test_the_workers_role_purges_every_table_it_keeps(env) -> None:
    """The worker purges now and then under its least-privilege role: aged records, receipts
    and sightings all go (seen failing with "permission denied for table published_batches":
    a FOR UPDATE asks for a privilege the role does not have there, and the worker's hourly
    purge stopped at the receipts)."""
    aged = uuid.uuid4()
    stack.fetch(env.dsn, "INSERT INTO published_batches VALUES ($1, now() - interval "
                         "'100 hours') RETURNING 1", aged)
    stack.fetch(env.dsn, "INSERT INTO duplicate_sightings (seen_at, cause, layer, "
                         "partition, txn_ids) VALUES (now() - interval '100 hours', "
                         "'redelivery', 'postgres', 0, '{T1}') RETURNING 1")

    async def purge_as_the_worker() -> int:
        conn = await asyncpg.connect(env.dsn)
        try:
            await conn.execute("SET ROLE payauth_worker")
            return await retention.purge(conn, retention_hours=72)
        finally:
            await conn.close()

    asyncio.run(purge_as_the_worker())
    assert not stack.fetch(env.dsn, "SELECT 1 FROM published_batches WHERE batch_id = $1", aged)
    assert not stack.fetch(env.dsn, "SELECT 1 FROM duplicate_sightings "
                                    "WHERE seen_at < now() - interval '72 hours'")
