"""``payauth explain TXN_ID``: one transaction on one screen, for a support agent in a dispute.

The decision (result, reason, amount, account, and the inputs it read: the account's
balance, currency and status, the rule's version), where the deciding message came from
(topic, partition, offset, message_id, correlation_id), when it was decided and when its
event was confirmed published (with the event_id downstream systems dedup on), the ledger
entry, and the duplicates seen by cause (``duplicate_sightings``: times a batch held it,
first and last). Read-only: the least-privilege worker role's SELECT grants are enough.
A transaction whose dedup record was purged after the retention window is still explained
from its ledger entry (approved ones only: a declined one leaves no ledger entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from service.domain.messages import event_id_for

_DECISION = """
SELECT p.txn_id, p.result, p.decline_reason, p.account_id, p.amount::text AS amount,
       p.currency, p.authorization_type, p.correlation_id, p.message_id, p.source_topic,
       p.source_partition, p.source_offset, p.processed_at, p.batch_id,
       p.input_balance::text AS input_balance, p.input_status, p.input_currency,
       p.rule_version,
       coalesce(p.published_at, b.published_at) AS published_at
  FROM processed_transactions p
  LEFT JOIN published_batches b ON b.batch_id = p.batch_id
 WHERE p.txn_id = $1
"""
_SIGHTINGS = """
SELECT cause, sum(cardinality(array_positions(txn_ids, $1))) AS times,
       min(seen_at) AS first, max(seen_at) AS last
  FROM duplicate_sightings WHERE txn_ids @> ARRAY[$1]::text[]
 GROUP BY cause ORDER BY min(seen_at)
"""
_LEDGER = """
SELECT entry_id, account_id, amount::text AS amount, currency, type, created_at
  FROM ledger_entries WHERE txn_id = $1
"""


@dataclass(frozen=True)
class Explanation:
    transaction_id: str
    decision: dict[str, Any] | None
    ledger: dict[str, Any] | None
    duplicates: list[dict[str, Any]]

    @property
    def known(self) -> bool:
        return self.decision is not None or self.ledger is not None

    def render(self) -> str:
        if not self.known:
            return (f"explain: no transaction {self.transaction_id} (never decided, or "
                    "declined and purged after the retention window)")
        lines = [f"transaction  {self.transaction_id}",
                 f"event_id     {event_id_for(self.transaction_id)}"]
        d = self.decision
        if d is not None:
            reason = f" ({d['decline_reason']})" if d["decline_reason"] else ""
            lines += [
                f"decision     {d['result']}{reason}",
                f"request      {d['authorization_type']} {d['amount']} {d['currency']} "
                f"on account {d['account_id']}",
                f"inputs       {_inputs(d)}",
                f"decided at   {d['processed_at'].isoformat()}",
                f"from         {d['source_topic']} partition {d['source_partition']} offset "
                f"{d['source_offset']}, message_id {d['message_id']}, correlation_id "
                f"{d['correlation_id']}",
                "published    " + (d["published_at"].isoformat() if d["published_at"] else
                                   "not confirmed yet (a redelivery republishes it, same "
                                   "event_id)"),
            ]
        else:
            lines.append("decision     APPROVED (dedup record purged after the retention "
                         "window; the ledger entry remains)")
        g = self.ledger
        if g is not None:
            lines.append(f"ledger       entry {g['entry_id']}: {g['amount']} {g['currency']} "
                         f"({g['type']}) on {g['account_id']} at {g['created_at'].isoformat()}")
        else:
            lines.append("ledger       no entry (nothing was debited or credited)")
        if not self.duplicates:
            lines.append("duplicates   none seen")
        for i, dup in enumerate(self.duplicates):
            lines.append(("duplicates   " if i == 0 else "             ")
                         + f"{dup['cause']}: {dup['times']} time(s), first "
                         f"{dup['first'].isoformat()}, last {dup['last'].isoformat()}")
        return "\n".join(lines)


def _inputs(d: dict[str, Any]) -> str:
    """What the decision read, as migration 007 records it."""
    if d["rule_version"] is None:
        return "not recorded (decided by a version before decision inputs were kept)"
    if d["input_balance"] is None:
        return f"no such account (rule {d['rule_version']})"
    return (f"account balance {d['input_balance']} {d['input_currency']}, status "
            f"{d['input_status']} (rule {d['rule_version']})")


async def explain(dsn: str, transaction_id: str) -> Explanation:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            decision = await conn.fetchrow(_DECISION, transaction_id)
            ledger = await conn.fetchrow(_LEDGER, transaction_id)
            duplicates = await conn.fetch(_SIGHTINGS, transaction_id)
    finally:
        await conn.close()
    return Explanation(transaction_id, dict(decision) if decision else None,
                       dict(ledger) if ledger else None, [dict(d) for d in duplicates])
