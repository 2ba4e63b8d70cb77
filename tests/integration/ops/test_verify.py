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
