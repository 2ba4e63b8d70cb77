"""``payauth explain TXN_ID``: one transaction on one screen, for a support agent in a dispute.

The decision (result, reason, amount, account, and the inputs it read: the account's
balance, currency and status, the rule's version; the card controls it was judged on: the
card's status and expiry, the blocks that matched, each spending limit with the usage it
read in the message's period, the one exceeded), where the deciding message came from
(topic, partition, offset, message_id, correlation_id), when it was decided and when its
event was confirmed published (with the event_id downstream systems dedup on), the ledger
entry, and the duplicates seen by cause (``duplicate_sightings``: times a batch held it,
first and last). Read-only: the least-privilege worker role's SELECT grants are enough.
A transaction whose dedup record was purged after the retention window is still explained
from its ledger entry (approved ones only: a declined one leaves no ledger entry).

The lifecycle kinds (docs/lifecycle.md), from their never-purged rows: a hold's whole life
(placed, reversals waiting for it and applied when it came, each reversal or clearing that
named it, its end and what the end released, the HoldExpired publication); a REVERSAL's or
CLEARING's original and what it applied; an orphan reversal's wait.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import asyncpg

from service.domain.messages import event_id_for
from service.domain.money import format_amount

_DECISION = """
SELECT p.txn_id, p.result, p.decline_reason, p.account_id, p.amount::text AS amount,
       p.currency, p.authorization_type, p.correlation_id, p.message_id, p.source_topic,
       p.source_partition, p.source_offset, p.processed_at, p.batch_id,
       p.input_balance::text AS input_balance, p.input_status, p.input_currency,
       p.rule_version, p.amount_approved::text AS amount_approved, p.partial_ok,
       p.billing_amount::text AS billing_amount, p.billing_currency, p.final,
       p.ledger_balance::text AS ledger_balance, p.already_cleared::text AS already_cleared,
       p.input_hold_state, p.card_id, p.merchant_category, p.merchant_country,
       p.message_time, p.input_card_status, p.input_card_expires, p.input_blocks,
       payauth_input_limits(p.input_limit_reads, p.input_limits)::text AS input_limits,
       p.limit_id,
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
_LIFECYCLE = """
SELECT kind, result, amount::text AS amount, currency, original_txn_id,
       amount_applied::text AS applied, forced, orphan, ended_hold, decided_at, final
  FROM lifecycle_messages WHERE txn_id = $1
"""
_HOLD = """
SELECT txn_id, kind, account_id, amount::text AS amount, remaining::text AS remaining,
       incremented::text AS incremented, currency, state, placed_at, ended_at, ended_by,
       released::text AS released, expiry_published_at
  FROM holds WHERE txn_id = $1
"""
# Everything that named the hold, in the order it was decided.
_NAMED_IT = """
SELECT txn_id, kind, amount::text AS amount, amount_applied::text AS applied, orphan,
       ended_hold, decided_at, final, result
  FROM lifecycle_messages WHERE original_txn_id = $1
 ORDER BY decided_at, txn_id
"""
_ORPHANS = """
SELECT txn_id, state, amount::text AS amount, applied::text AS applied, arrived_at,
       resolved_at
  FROM orphan_reversals WHERE original_txn_id = $1 OR txn_id = $1
 ORDER BY arrival
"""
# Clearings that came before the hold they name (each kept until the hold came).
_EARLY = """
SELECT txn_id, state, amount::text AS amount, applied::text AS applied, final, arrived_at,
       resolved_at
  FROM early_clearings WHERE original_txn_id = $1 OR txn_id = $1
 ORDER BY arrival
"""
_LEDGER = """
SELECT account_id, amount::text AS amount, currency, type, created_at
  FROM ledger_entries WHERE txn_id = $1
"""


@dataclass(frozen=True)
class Explanation:
    transaction_id: str
    decision: dict[str, Any] | None
    ledger: dict[str, Any] | None
    duplicates: list[dict[str, Any]]
    lifecycle: dict[str, Any] | None = None  # the message's lifecycle row
    hold: dict[str, Any] | None = None  # the hold it placed, or the hold it named
    named: list[dict[str, Any]] = field(default_factory=list)  # what named that hold
    orphans: list[dict[str, Any]] = field(default_factory=list)
    original_ledger: dict[str, Any] | None = None  # the purchase a REVERSAL named
    early: list[dict[str, Any]] = field(default_factory=list)  # clearings before the hold

    @property
    def known(self) -> bool:
        return self.decision is not None or self.ledger is not None \
            or self.lifecycle is not None

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
                f"decision     {d['result']}{reason}" + _approved(d),
                f"request      {d['authorization_type']} {d['amount']} {d['currency']} "
                f"on account {d['account_id']}" + _request(d),
                f"inputs       {_inputs(d)}",
                *_controls(d),
                f"decided at   {d['processed_at'].isoformat()}",
                f"from         {d['source_topic']} partition {d['source_partition']} offset "
                f"{d['source_offset']}, message_id {d['message_id']}, correlation_id "
                f"{d['correlation_id']}",
                "published    " + (d["published_at"].isoformat() if d["published_at"] else
                                   "not confirmed yet (a redelivery republishes it, same "
                                   "event_id)"),
            ]
        elif self.lifecycle is not None:
            m = self.lifecycle
            lines.append(f"decision     {m['result']} {m['kind']} {m['amount']} {m['currency']} "
                         "(dedup record purged after the retention window; the lifecycle "
                         "record remains)")
        else:
            lines.append("decision     APPROVED (dedup record purged after the retention "
                         "window; the ledger entry remains)")
        g = self.ledger
        if g is not None:
            lines.append(f"ledger       entry: {g['amount']} {g['currency']} "
                         f"({g['type']}) on {g['account_id']} at {g['created_at'].isoformat()}")
        else:
            lines.append("ledger       no entry (nothing was debited or credited)")
        lines += self._lifecycle_lines()
        if not self.duplicates:
            lines.append("duplicates   none seen")
        for i, dup in enumerate(self.duplicates):
            lines.append(("duplicates   " if i == 0 else "             ")
                         + f"{dup['cause']}: {dup['times']} time(s), first "
                         f"{dup['first'].isoformat()}, last {dup['last'].isoformat()}")
        return "\n".join(lines)


    def _lifecycle_lines(self) -> list[str]:
        m, h = self.lifecycle, self.hold
        lines: list[str] = []
        if m is not None and m["kind"] in ("REVERSAL", "CLEARING", "INCREMENTAL"):
            if m["applied"] is not None:
                m["applied"] = format_amount(Decimal(m["applied"]), m["currency"])
            what = {"REVERSAL": "released", "CLEARING": "released from its hold",
                    "INCREMENTAL": "added to its hold"}[m["kind"]]
            lines.append(f"original     {m['original_txn_id'] or 'none named'}"
                         + (" (forced: no hold to end)" if m["forced"] else "")
                         + f"; {what} {m['applied']}"
                         + (" (ended the hold)" if m["ended_hold"] else ""))
            if self.original_ledger is not None:
                g = self.original_ledger
                lines.append(f"             {g['type']} {g['amount']} {g['currency']} at "
                             f"{g['created_at'].isoformat()} (credited back up to what is "
                             "not yet reversed)")
        for o in self.orphans:
            if o["txn_id"] == self.transaction_id:
                lines.append(f"orphan       came before its original: {o['state']}"
                             + (f", applied {o['applied']} at {o['resolved_at'].isoformat()}"
                                if o["resolved_at"] else ", waiting"))
        if h is None:
            return lines
        own = h["txn_id"] == self.transaction_id
        for key in ("amount", "remaining", "released"):
            if h[key] is not None:
                h[key] = format_amount(Decimal(h[key]), h["currency"])
        for row in (*self.named, *self.orphans):
            for key in ("amount", "applied"):
                if row.get(key) is not None:
                    row[key] = format_amount(Decimal(row[key]), h["currency"])
        incremented = Decimal(h["incremented"] or 0)
        lines.append(("hold         " if own else "its hold     ")
                     + f"{h['txn_id']} {h['kind']} {h['amount']} {h['currency']}"
                     + (f" + {format_amount(incremented, h['currency'])} incremented"
                        if incremented else "")
                     + f": {h['state']}, {h['remaining']} still held")
        lines.append(f"  placed     {h['placed_at'].isoformat()}")
        for e in self.early:
            if e["txn_id"] != h["txn_id"] and e["state"] != "WAITING":
                lines.append(f"  clearing   {e['txn_id']} {e['amount']} (came first"
                             + ("" if e["final"] else ", not final") + f"): {e['state']}, "
                             f"released {e['applied']}")
        for o in self.orphans:
            if o["txn_id"] != h["txn_id"] and o["state"] != "WAITING":
                lines.append(f"  orphan     {o['txn_id']} REVERSAL {o['amount']} (came first): "
                             f"{o['state']}, released {o['applied']}")
        for n in self.named:
            if n["orphan"]:
                continue  # shown above, as applied when the hold was placed
            verb = "added" if n["kind"] == "INCREMENTAL" else "released"
            lines.append(f"  {n['kind'].lower():<10} {n['txn_id']} {n['amount']} at "
                         f"{n['decided_at'].isoformat()}: "
                         + ("declined" if n["result"] != "APPROVED" else
                            f"{verb} {n['applied']}")
                         + (" (not final)" if n["final"] is False else "")
                         + (", ended it" if n["ended_hold"] else ""))
        if h["state"] == "EXPIRED":
            lines.append(f"  expired    {h['ended_at'].isoformat()}: released {h['released']}"
                         ", HoldExpired " + (f"published {h['expiry_published_at'].isoformat()}"
                                             if h["expiry_published_at"]
                                             else "not published yet (the next run does)"))
        elif h["ended_at"] is not None:
            lines.append(f"  ended      {h['ended_at'].isoformat()}: {h['state']}"
                         + (f" by {h['ended_by']}" if h["ended_by"] else " (by orphans)"))
        return lines


def _approved(d: dict[str, Any]) -> str:
    """What was approved, when it is not the amount as sent: in part, or converted."""
    approved = d.get("amount_approved")
    if d["result"] != "APPROVED" or approved is None:
        return ""
    currency = d["input_currency"] or d["currency"]
    text = format_amount(Decimal(approved), currency)
    if d["billing_currency"] is None and text == d["amount"]:
        return ""
    asked = d["billing_amount"] if d["billing_currency"] == currency else d["amount"]
    partially = d["partial_ok"] and Decimal(approved) < Decimal(asked)
    return f": {text} {currency}" + (f" approved of {asked} asked (partial)" if partially
                                       else "")


def _request(d: dict[str, Any]) -> str:
    """What the request carried beside its amount: a conversion, a partial approval's
    acceptance, a clearing's place among several, an inquiry's figures."""
    parts = []
    if d.get("billing_currency"):
        parts.append(f"billing {d['billing_amount']} {d['billing_currency']}")
    if d.get("partial_ok"):
        parts.append("partial approval accepted")
    if d.get("final") is False:
        parts.append("not the final clearing")
    if d.get("ledger_balance") is not None:
        parts.append(f"answered: ledger balance {d['ledger_balance']}, available "
                     f"{d['input_balance']}")
    if d.get("already_cleared") is not None:
        parts.append(f"cleared {d['already_cleared']} before it came")
    return f" ({'; '.join(parts)})" if parts else ""


def _inputs(d: dict[str, Any]) -> str:
    """What the decision read, as the batch statement records it beside the decision."""
    if d["rule_version"] is None:
        return "not recorded (decided by a version before decision inputs were kept)"
    if d["input_balance"] is None:
        return f"no such account (rule {d['rule_version']})"
    return (f"account balance {d['input_balance']} {d['input_currency']}, status "
            f"{d['input_status']} (rule {d['rule_version']})")


def _controls(d: dict[str, Any]) -> list[str]:
    """What the card controls judged the decision on, as it read them: the card, the blocks
    that matched, each limit with its usage in the message's period (none when no control
    applied)."""
    if d["message_time"] is None:
        return []
    card = ("none named" if d["card_id"] is None else
            f"{d['card_id']}: no such card of the account" if d["input_card_status"] is None
            else f"{d['card_id']}, status {d['input_card_status']}, "
                 f"valid through {d['input_card_expires'] or 'no expiry'}")
    lines = [f"card         {card}; message time {d['message_time'].isoformat()}, merchant "
             f"category {d['merchant_category']}, country {d['merchant_country'] or 'none'}"]
    if d["input_blocks"]:
        lines.append(f"blocked      {', '.join(d['input_blocks']).lower()} (a block of the "
                     "account or card matched)")
    # (Amounts as the database wrote them: 40.00, never the float 40.0.)
    for limit in json.loads(d["input_limits"] or "[]", parse_float=Decimal):
        period = (f"{limit['period_start']}" if limit["period_start"] else "each message")
        used = []
        if limit["max_amount"] is not None:
            used.append(f"amount {limit['used_amount']} of {limit['max_amount']}")
        if limit["max_count"] is not None:
            used.append(f"count {limit['used_count']} of {limit['max_count']}")
        mark = "  <- exceeded" if limit["limit_id"] == d["limit_id"] else ""
        lines.append(f"limit        {limit['limit_id']} ({period}): {', '.join(used)} before "
                     f"it{mark}")
    return lines


async def explain(dsn: str, transaction_id: str) -> Explanation:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            decision = await conn.fetchrow(_DECISION, transaction_id)
            ledger = await conn.fetchrow(_LEDGER, transaction_id)
            duplicates = await conn.fetch(_SIGHTINGS, transaction_id)
            lifecycle = await conn.fetchrow(_LIFECYCLE, transaction_id)
            original = lifecycle["original_txn_id"] if lifecycle else None
            hold = await conn.fetchrow(_HOLD, original or transaction_id)
            hold_id = hold["txn_id"] if hold else None
            named = await conn.fetch(_NAMED_IT, hold_id) if hold_id else []
            orphans = await conn.fetch(_ORPHANS, hold_id or transaction_id)
            early = await conn.fetch(_EARLY, hold_id or transaction_id)
            if hold_id is None and original is not None:  # a reversal of a purchase
                original_ledger = await conn.fetchrow(_LEDGER, original)
            else:
                original_ledger = None
    finally:
        await conn.close()
    return Explanation(transaction_id, dict(decision) if decision else None,
                       dict(ledger) if ledger else None, [dict(d) for d in duplicates],
                       dict(lifecycle) if lifecycle else None, dict(hold) if hold else None,
                       [dict(n) for n in named], [dict(o) for o in orphans],
                       dict(original_ledger) if original_ledger else None,
                       [dict(e) for e in early])
