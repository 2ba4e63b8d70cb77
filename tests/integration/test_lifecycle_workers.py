"""Lifecycles under two workers, one of them killed mid-stream (its partitions move, its
last batches are read again): every account ends with the balance and held amounts its
messages imply, each hold in the state they imply, and ``payauth verify`` passes."""

from __future__ import annotations

import asyncio
import signal
import time
from decimal import Decimal
from typing import Any

from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.factory import encode
from tests.support.workers import wait_caught_up


def _lives(account: str, tag: str) -> list[dict[str, Any]]:
    """One account's messages, in order: a hold partially reversed twice (one reversal
    redelivered) and cleared; an orphan reversal before its hold; an advice; a purchase
    reversed in part."""
    a, b, p = f"{tag}-A", f"{tag}-B", f"{tag}-P"
    r1 = lc.msg(f"{tag}-R1", "REVERSAL", account, "30.00", a)
    return [
        lc.msg(a, "AUTHORIZATION", account, "100.00"),
        r1,
        lc.msg(f"{tag}-R2", "REVERSAL", account, "30.00", a),
        r1,
        lc.msg(f"{tag}-C", "CLEARING", account, "50.00", a),
        lc.msg(f"{tag}-RB", "REVERSAL", account, "20.00", b),
        lc.msg(b, "AUTHORIZATION", account, "60.00"),
        lc.msg(f"{tag}-ADV", "ADVICE", account, "10.00"),
        lc.msg(p, "PURCHASE", account, "40.00"),
        lc.msg(f"{tag}-RP", "REVERSAL", account, "15.00", p),
    ]


def test_lifecycles_survive_a_killed_worker(env, spawn_worker) -> None:
    run = lc.names("x")["x"]
    accounts = [f"{run}-ACC{i}" for i in range(12)]
    asyncio.run(stack.seed_accounts(env.dsn, [(a, "1000.00", "EUR") for a in accounts]))
    streams = {a: _lives(a, f"{a}-L") for a in accounts}
    first = spawn_worker(env, "one")
    spawn_worker(env, "two")
    # In waves, the kill between them: each account's later messages come after it.
    for wave in range(0, 10, 2):
        stack.produce(env.input_topic, [(a.encode(), encode(m)) for a in accounts
                                        for m in streams[a][wave:wave + 2]])
        if wave == 4:
            time.sleep(0.5)
            first.signal(signal.SIGKILL)
            spawn_worker(env, "three")
    wait_caught_up(env.group_id, env.input_topic, env.partitions, timeout=180)

    for a in accounts:
        # cleared 50, purchase 40 of which 15 credited back; held: B 60 - 20, the advice 10
        assert lc.balances(env, a) == (Decimal("925.00"), Decimal("50.00"), Decimal("875.00")), a
        tag = f"{a}-L"
        assert (lc.hold(env, f"{tag}-A")["state"], lc.hold(env, f"{tag}-A")["released"]) == \
            ("CLEARED", Decimal("40.00"))
        assert lc.hold(env, f"{tag}-B")["remaining"] == Decimal("40.00")
    lc.verified(env)
