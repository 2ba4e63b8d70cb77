"""What a downstream consumer sees: the output topic alone, with no access to the database.
Read from its start, each ``event_id`` counted once (its repeats identical), it must rebuild
every account's ledger balance (opening + the sum of ``balance_delta``) and held amount (the
sum of ``held_delta``) as the database has them; and every orphan reversal applied must
have its ``ReversalApplied``, with what it applied."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any


@dataclass
class Finding:
    name: str
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def rebuilt_from_events(events: list[dict[str, Any]], balances: dict[str, Any]) -> Finding:
    """Every account's balance and held amount rebuilt from the events alone, as a
    downstream consumer would (each ``event_id`` once, its repeats identical), against the
    database (``balances``: the accounts' rows, with their opening balances)."""
    finding = Finding("the events alone rebuild every balance and held amount (each event_id "
                      "once)")
    first: dict[str, dict[str, Any]] = {}
    moved: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for event in events:
        seen = first.setdefault(event["event_id"], event)
        if seen is not event:
            if seen != event:
                finding.violations.append(f"event {event['event_id']} "
                                          f"({event['transaction_id']}) repeated otherwise")
            continue
        if "balance_delta" not in event or "held_delta" not in event:
            finding.violations.append(f"{event['event_type']} {event['transaction_id']}: "
                                      "no balance_delta or held_delta")
            continue
        totals = moved[event["account_id"]]
        totals[0] += Decimal(event["balance_delta"])
        totals[1] += Decimal(event["held_delta"])
    for account, row in balances.items():
        balance, held = moved.get(account, (Decimal(0), Decimal(0)))
        rebuilt = (row["opening_balance"] + balance, held)
        if rebuilt != (row["balance"], row["held"]):
            finding.violations.append(
                f"{account}: the events rebuild balance/held {rebuilt[0]}/{rebuilt[1]}, the "
                f"database has {row['balance']}/{row['held']}")
    return finding


def reversals_applied(events: dict[str, list[dict[str, Any]]],
                      applied: dict[str, Decimal]) -> Finding:
    """``events``: the ReversalApplied events by reversal; ``applied``: the database's
    applied orphan reversals, with what each applied."""
    finding = Finding("a ReversalApplied for every orphan reversal applied, with what it "
                      "applied; repeats identical")
    for txn, amount in applied.items():
        seen = events.get(txn, [])
        if not seen:
            finding.violations.append(f"{txn}: applied {amount}, no ReversalApplied")
        elif any(e != seen[0] for e in seen) or Decimal(seen[0]["amount_applied"]) != amount:
            finding.violations.append(f"{txn}: ReversalApplied events differ or disagree "
                                      f"with the applied {amount}")
    finding.violations += [f"{txn}: ReversalApplied for no applied reversal"
                           for txn in events if txn not in applied]
    return finding
