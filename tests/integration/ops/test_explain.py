"""``payauth explain TXN_ID``: the decision, where it came from, its event and its ledger
entry, on one screen, from a real worker's decision; exit 1 for an unknown transaction."""

from __future__ import annotations

import asyncio
import uuid

from service.domain.messages import event_id_for
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.workers import payauth, wait_caught_up, wait_until


def test_explain_a_decided_and_an_unknown_transaction(env, spawn_worker) -> None:
    account = f"ACC-{uuid.uuid4().hex[:8]}"
    asyncio.run(stack.seed_accounts(env.dsn, [(account, "100.00", "EUR")]))
    approved, declined = f"EX-{uuid.uuid4().hex[:8]}", f"EX-{uuid.uuid4().hex[:8]}"
    stack.produce(env.input_topic, [
        (account.encode(), encode(auth_message(approved, account_id=account, amount="40.00",
                                               message_id="msg-explain-1"))),
        (account.encode(), encode(auth_message(declined, account_id=account, amount="80.00"))),
    ], partition=1)
    worker = spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)
    wait_until(lambda: "not confirmed" not in payauth(env, "explain", approved).stdout, 30,
               "the publication receipt")
    assert worker.terminate() == 0

    shown = payauth(env, "explain", approved)
    assert shown.returncode == 0, shown.stderr
    for expected in ("decision     APPROVED", f"PURCHASE 40.00 EUR on account {account}",
                     event_id_for(approved), "partition 1 offset 0",
                     "message_id msg-explain-1", "ledger       entry", "-40.00 EUR",
                   "inputs       account balance 100.00 EUR, status ACTIVE (rule "):
        assert expected in shown.stdout, (expected, shown.stdout)
    other = payauth(env, "explain", declined)
    assert other.returncode == 0
    assert "DECLINED (INSUFFICIENT_FUNDS)" in other.stdout and "no entry" in other.stdout
    assert "inputs       account balance 60.00 EUR" in other.stdout  # after the approval
    unknown = payauth(env, "explain", "NO-SUCH-TXN")
    assert unknown.returncode == 1 and "no transaction NO-SUCH-TXN" in unknown.stdout
