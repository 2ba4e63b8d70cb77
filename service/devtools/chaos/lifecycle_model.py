"""What the ground-truth log implies for the money: each account's ledger balance and held
amount, each hold's life and end, each transaction's ledger entry. Pure, and written from
the contract's rules, not from the SQL that implements them (a model that copied the SQL
would agree with its bugs):

- PURCHASE debits, REFUND credits (when approved, which the log's ``expect`` says);
- AUTHORIZATION/ADVICE approved: a hold of its amount, net of the orphan reversals that
  named it before it came (each applied in the order it came, capped by what remains; a
  hold reversed to nothing by them ends REVERSED at once, by no message); declined: those
  orphans change nothing;
- REVERSAL of an active hold: releases up to what remains (capped); what remains reaching
  zero ends the hold REVERSED by it; of an ended hold or a declined original: nothing; of
  a PURCHASE: credits up to what of it is not yet credited back; of an original not seen
  yet: waits (an orphan), to be applied when the original comes (to a purchase too);
- CLEARING: debits its amount whatever happens; ends its original's hold CLEARED if the
  hold is still active, whatever remains; without one (forced) or after the end: only the
  debit;
- expiry is the one effect not in the log: the checker learns it from the database. It
  ends what remains of an active hold, so an expired hold keeps nothing, and what it
  released is what remained at some point of the hold's active life
  (``Hold.while_active``); a reversal after it releases nothing and a clearing after it
  ends nothing (nothing here changes: the ledger does not see holds).

The order is the partition's: one account's messages share a key, so a partition, and the
worker decides them in offset order; the first copy of a transaction decides, the later
ones (redeliveries, retries with a new message_id, late replays) are duplicates. A message
sent to another partition on purpose (``pinned``) is ordered by nothing the log knows: the
generator pins only plain purchases and refunds, whose order does not matter, and the
model counts them at their first copy on the key's partition.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

ZERO = Decimal(0)


@dataclass
class Hold:
    txn: str
    account: str
    amount: Decimal
    remaining: Decimal
    state: str = "ACTIVE"          # or REVERSED / CLEARED (EXPIRED only the database knows)
    ended_by: str | None = None    # the message that ended it
    while_active: list[Decimal] = field(default_factory=list)  # what an expiry could release


@dataclass
class Expected:
    balance_delta: dict[str, Decimal]  # per account: what the ledger moved
    holds: dict[str, Hold]
    ledger: dict[str, Decimal]         # per transaction: its one ledger entry's amount
    orphans_waiting: int
    lifecycle_decided: int             # lifecycle messages decided (first copies)

    def held(self, expired: set[str]) -> dict[str, Decimal]:
        """What each account's holds keep, those the database says expired keeping nothing."""
        out: dict[str, Decimal] = defaultdict(Decimal)
        for hold in self.holds.values():
            if hold.state == "ACTIVE" and hold.txn not in expired:
                out[hold.account] += hold.remaining
        return out


_LIFECYCLE = {"AUTHORIZATION", "ADVICE", "REVERSAL", "CLEARING"}


def decided_in_order(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first copy of each transaction, in the order the worker decides them (per
    account: partition, then offset; accounts are independent of each other)."""
    lines = [m for m in log if m.get("type") and m["expect"] in ("approved", "declined")
             and not m.get("pinned")]
    lines.sort(key=lambda m: (m["key"], m["partition"], m["offset"]))
    seen: set[str] = set()
    out = []
    for m in lines:
        if m["txn"] not in seen:
            seen.add(m["txn"])
            out.append(m)
    return out


def implied_by(log: list[dict[str, Any]]) -> Expected:
    delta: dict[str, Decimal] = defaultdict(Decimal)
    holds: dict[str, Hold] = {}
    ledger: dict[str, Decimal] = {}
    purchases: dict[str, tuple[Decimal, Decimal]] = {}  # txn: (amount, credited back)
    declined: set[str] = set()
    waiting: dict[str, list[tuple[str, Decimal]]] = defaultdict(list)
    lifecycle = 0

    def post(txn: str, account: str, amount: Decimal) -> None:
        delta[account] += amount
        ledger[txn] = amount

    def credit_back(txn: str, account: str, purchase: str, amount: Decimal) -> None:
        total, credited = purchases[purchase]
        applied = min(amount, total - credited)
        purchases[purchase] = (total, credited + applied)
        if applied > 0:
            post(txn, account, applied)

    for m in decided_in_order(log):
        txn, account, kind = m["txn"], m["key"], m["type"]
        amount = Decimal(m["amount"])
        original = m.get("original")
        approved = m["expect"] == "approved"
        lifecycle += kind in _LIFECYCLE
        if kind in ("PURCHASE", "REFUND"):
            if not approved:
                declined.add(txn)
                waiting.pop(txn, None)
                continue
            post(txn, account, -amount if kind == "PURCHASE" else amount)
            if kind == "PURCHASE":
                purchases[txn] = (amount, ZERO)
                for reversal, reversed_amount in waiting.pop(txn, []):
                    credit_back(reversal, account, txn, reversed_amount)
        elif kind in ("AUTHORIZATION", "ADVICE"):
            orphans = waiting.pop(txn, [])
            if not approved:
                declined.add(txn)
                continue
            placed = amount
            for _reversal, reversed_amount in orphans:
                placed -= min(reversed_amount, placed)
            hold = Hold(txn, account, amount, placed)
            if placed == 0:
                hold.state = "REVERSED"
            else:
                hold.while_active.append(placed)
            holds[txn] = hold
        elif kind == "REVERSAL":
            assert original is not None, f"{txn}: a REVERSAL names its original"
            if original in holds:
                hold = holds[original]
                if hold.state == "ACTIVE":
                    hold.remaining -= min(amount, hold.remaining)
                    if hold.remaining == 0:
                        hold.state, hold.ended_by = "REVERSED", txn
                    else:
                        hold.while_active.append(hold.remaining)
            elif original in purchases:
                credit_back(txn, account, original, amount)
            elif original not in declined:
                waiting[original].append((txn, amount))
        elif kind == "CLEARING" and approved:
            post(txn, account, -amount)
            hold_ = holds.get(original) if original else None
            if hold_ is not None and hold_.state == "ACTIVE":
                hold_.remaining = ZERO
                hold_.state, hold_.ended_by = "CLEARED", txn
    return Expected(dict(delta), holds, ledger,
                    sum(len(v) for v in waiting.values()), lifecycle)
