"""``payauth verify`` (``service/ops/verify.py``) on a real database: exit 0 while the money
adds up, and a broken invariant named with the account that breaks it."""

from __future__ import annotations

import asyncio
import uuid

from tests.support import stack
from tests.support.workers import payauth


def test_verify_passes_then_names_a_balance_that_does_not_add_up(env: stack.Env) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "50.00", "EUR")]))
    clean = payauth(env, "verify")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.strip().endswith("verify: all invariants hold")

    stack.fetch(env.dsn, "UPDATE accounts SET balance = balance + 1 WHERE account_id = $1",
                account)
    broken = payauth(env, "verify")
    assert broken.returncode == 1
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "balance = opening balance + ledger" in failed[0]
    assert account in failed[0]


def test_verify_names_a_reversal_left_waiting_for_an_original_decided_on_its_account(
        env: stack.Env) -> None:
    """What a purchase's batch that missed a waiting orphan left (the reversal's credit
    lost, the balance 90.00 where the contract says 100.00): every other invariant holds,
    this one names the reversal."""
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    stack.fetch(env.dsn, """
        WITH o AS (INSERT INTO orphan_reversals (txn_id, original_txn_id, account_id, currency,
                                                 amount, state)
                   VALUES ('R1', 'X1', $1, 'EUR', 10, 'WAITING') RETURNING 1),
             l AS (INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type,
                                               created_at)
                   VALUES ('X1', $1, -10, 'EUR', 'PURCHASE', now()) RETURNING 1)
        UPDATE accounts SET balance = 90 WHERE account_id = $1 RETURNING 1""", account)
    broken = payauth(env, "verify")
    assert broken.returncode == 1
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, broken.stdout
    assert "no reversal waits although its original has been decided" in failed[0]
    assert "R1 waits for X1" in failed[0]


def test_verify_names_a_reversal_that_credited_another_accounts_purchase(
        env: stack.Env) -> None:
    """What a reversal of account A that read B's purchase as its own would leave (A credited
    10.00 from B's purchase): every balance adds up, this invariant names the reversal."""
    run = uuid.uuid4().hex[:8]
    a, b = f"ACC-A-{run}", f"ACC-B-{run}"
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "100.00", "EUR"), (b, "100.00", "EUR")]))
    stack.fetch(env.dsn, """
        WITH p AS (INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type,
                                               created_at)
                   VALUES ('X1', $2, -10, 'EUR', 'PURCHASE', now()),
                          ('R1', $1, 10, 'EUR', 'REVERSAL', now()) RETURNING 1),
             m AS (INSERT INTO lifecycle_messages (txn_id, kind, account_id, currency, amount,
                                                   fingerprint, original_txn_id, result,
                                                   amount_applied, processed_at)
                   VALUES ('R1', 'REVERSAL', $1, 'EUR', 10, 'f', 'X1', 'APPROVED', 10, now())
                   RETURNING 1),
             ua AS (UPDATE accounts SET balance = 110 WHERE account_id = $1 RETURNING 1)
        UPDATE accounts SET balance = 90 WHERE account_id = $2 RETURNING 1""", a, b)
    broken = payauth(env, "verify")
    assert broken.returncode == 1
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, broken.stdout
    assert "applies only to an original of its account" in failed[0]
    assert f"R1 of {a} applied 10 to X1 of {b}" in failed[0]


def test_verify_names_a_ledger_entry_and_a_hold_of_no_account(env: stack.Env) -> None:
    """No foreign key refuses them (migration 015): the writers never write them, and verify
    names one if anything else did."""
    stack.fetch(env.dsn, """
        WITH l AS (INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type,
                                               created_at)
                   VALUES ('P1', 'NO-SUCH', 10, 'EUR', 'REFUND', now()) RETURNING 1)
        INSERT INTO holds (txn_id, account_id, currency, kind, amount, remaining, state)
        VALUES ('A1', 'NO-SUCH', 'EUR', 'AUTHORIZATION', 5, 5, 'ACTIVE')""")
    broken = payauth(env, "verify")
    assert broken.returncode == 1
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2, broken.stdout  # (and the hold that no message placed)
    assert "every ledger entry and hold names an account" in failed[0]
    assert "ledger entry P1 of NO-SUCH" in failed[0] and "hold A1 of NO-SUCH" in failed[0]
    assert "each hold's amount and increments are what its messages approved" in failed[1]
