"""``payauth-dev demo`` end to end on real services: its summary agrees with the ground truth,
with the database, and with ``payauth verify``; its events alone rebuild every balance and
held amount; and a shadow replay of its whole stream finds nothing that would change."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import asyncpg

from service.devtools.chaos.rebuild import rebuilt_from_events
from tests.support import stack
from tests.support.workers import payauth


def test_demo_summary_agrees_with_the_database_and_verify(env: stack.Env, tmp_path) -> None:
    ports = f"{stack.free_port()},{stack.free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "service.devtools", "demo", "--transactions", "600",
         "--accounts", "80", "--seed", "11", "--log-dir", str(tmp_path), "--metrics-ports", ports],
        cwd=stack.ROOT, env=env.worker_env(PAYAUTH_LOG_LEVEL="WARNING"),
        capture_output=True, text=True, timeout=600,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    rows = {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^(approved|declined|duplicate|conflict|invalid)\s+(\d+)\s+(\d+)",
                                 out, re.M)}
    assert set(rows) == {"approved", "declined", "duplicate", "conflict", "invalid"}
    assert all(exp == obs for exp, obs in rows.values()), out
    assert rows["duplicate"][1] > 0 and rows["invalid"][1] > 0 and rows["declined"][1] > 0
    assert "verify: all invariants hold" in out

    async def counts() -> dict[str, int]:
        conn = await asyncpg.connect(env.dsn)
        try:
            records = await conn.fetch(
                "SELECT result, count(*) AS n FROM processed_transactions GROUP BY result")
            return {r["result"]: r["n"] for r in records}
        finally:
            await conn.close()

    db = asyncio.run(counts())
    assert db == {"APPROVED": rows["approved"][1], "DECLINED": rows["declined"][1]}
    dlq = stack.read_topic(env.dlq_topic, expect=rows["invalid"][1] + rows["conflict"][1])
    assert len(dlq) == rows["invalid"][1] + rows["conflict"][1]

    # The events alone (each event_id once) rebuild every account's balance and held amount,
    # the orphan reversal's ReversalApplied and the expiry's HoldExpired among them.
    async def balances() -> dict[str, asyncpg.Record]:
        conn = await asyncpg.connect(env.dsn)
        try:
            return {r["account_id"]: r for r in await conn.fetch(
                "SELECT b.account_id, a.opening_balance, b.balance, b.held "
                "FROM account_balances b JOIN accounts a USING (account_id)")}
        finally:
            await conn.close()

    events = [json.loads(r.value()) for r in stack.read_topic(env.output_topic)]
    assert {"ReversalApplied", "HoldExpired", "PaymentReversed", "PaymentCleared"} <= \
        {e["event_type"] for e in events}
    rebuilt = rebuilt_from_events(events, asyncio.run(balances()))
    assert rebuilt.ok, rebuilt.violations[:5]

    # Deciding the whole stream again with the code unchanged changes nothing: lifecycle
    # messages, dead-lettered ones (invalid, the conflict) and duplicates alike.
    shadow = payauth(env, "replay", "--shadow", "--to-earliest")
    assert shadow.returncode == 0, shadow.stdout + shadow.stderr
    assert "nothing would change" in shadow.stdout
