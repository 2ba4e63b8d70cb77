"""The card controls in the chaos run: cards with spending limits under the load, a card
frozen and thawed among the faults, and what the checker holds them to.

- Every rich account has a card with a daily and a monthly limit that the load never
  reaches; half the plain purchases name it. Those purchases are never reversed, so each
  limit's usage must be exactly the sum (and the count) of the distinct approved purchases
  the log sent on its card: a duplicate, a producer's retry, a redelivery after a crash, a
  replay after a purge counted twice shows here (``limit_findings``).
- One card is FROZEN from the start: its purchases are declined (the log expects it).
- One card is frozen and thawed by ``payauth cards status`` among the faults
  (``CardToggle``), and verifications name it all along. Each such decision must be judged
  by the status it read (ACTIVE: approved; else CARD_BLOCKED), and one sent when no change
  was under way and none came after it must have read the last status
  (``toggle_findings``): a status change applies to everything decided after it commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from service.devtools.chaos.rebuild import Finding
from service.ops import cards

NEVER_REACHED = Decimal("1000000000000")


def card_of(account: str) -> str:
    """A rich account's card."""
    return f"{account}-CARD"


def limit_ids(card: str) -> tuple[str, str]:
    """A card's daily and monthly limits."""
    return f"{card}-DAY", f"{card}-MONTH"


def setup_statements(rich: list[str], frozen: tuple[str, str], toggle: tuple[str, str]
                     ) -> list[tuple[str, list[Any]]]:
    """The cards, their limits: (SQL, arguments) to run once the accounts exist."""
    cards_rows = [(card_of(a), a, "ACTIVE") for a in rich] + \
        [(frozen[1], frozen[0], "FROZEN"), (toggle[1], toggle[0], "ACTIVE")]
    limits = [(limit, "CARD", card_of(a), period, NEVER_REACHED)
              for a in rich
              for limit, period in zip(limit_ids(card_of(a)), ("DAY", "MONTH"), strict=True)]
    return [
        ("INSERT INTO cards (card_id, account_id, status) "
         "SELECT * FROM unnest($1::text[], $2::text[], $3::text[])",
         [[c for c, _, _ in cards_rows], [a for _, a, _ in cards_rows],
          [s for _, _, s in cards_rows]]),
        ("INSERT INTO spending_limits (limit_id, scope, scope_id, period, max_amount) "
         "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::numeric[])",
         [[r[i] for r in limits] for i in range(5)]),
    ]


@dataclass
class CardToggle:
    """The card frozen and thawed among the faults; what the load reads of it as it sends
    (``now``): changes started, changes done, the status the last one left."""

    account: str
    card: str
    started: int = 0
    completed: int = 0
    status: str = "ACTIVE"
    uncertain: bool = False  # a change that never got an answer: nothing is strict after it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> list[Any]:
        with self.lock:
            return [self.started, self.completed, self.status, self.uncertain]

    def flip(self, dsn: str, patience: float = 60.0) -> None:
        """Freeze the card if active, thaw it if frozen (``payauth cards status``), retried
        while the database is away (the change is idempotent); counted done once it
        answered."""
        with self.lock:
            self.started += 1
            target = "FROZEN" if self.status == "ACTIVE" else "ACTIVE"
        deadline = time.monotonic() + patience
        while True:
            try:
                asyncio.run(cards.change_status(dsn, self.card, target, "chaos: a fault",
                                                by="chaos"))
                break
            except Exception:
                if time.monotonic() > deadline:
                    with self.lock:
                        self.uncertain = True
                    return
                time.sleep(1.0)
        with self.lock:
            self.completed += 1
            self.status = target


def limit_findings(log: list[dict[str, Any]], usage: dict[str, tuple[Decimal, int]]
                   ) -> Finding:
    """Each card's limits against the purchases the log sent on it: the sum and count of the
    distinct approved ones (``usage``: limit_id -> amount, count summed over its periods)."""
    finding = Finding("each spending limit counted what the log implies, once")
    approved: dict[str, dict[str, Decimal]] = defaultdict(dict)
    for m in log:
        card = m.get("card")
        if card and m["txn"] and m["expect"] == "approved" and m.get("type") == "PURCHASE":
            approved[card][m["txn"]] = Decimal(m["amount"])
    named = {m["card"] for m in log if m.get("card") and m.get("type") == "PURCHASE"}
    for card in sorted(named):
        want = (sum(approved[card].values(), Decimal(0)), len(approved[card]))
        for limit in limit_ids(card):
            got = usage.get(limit, (Decimal(0), 0))
            if (Decimal(got[0]), int(got[1])) != want:
                finding.violations.append(f"{limit}: usage {got[0]} in {got[1]}, the log "
                                          f"implies {want[0]} in {want[1]}")
    return finding


def toggle_findings(log: list[dict[str, Any]], judged: dict[str, Any],
                    changes: int | None) -> Finding:
    """The toggled card's verifications (``judged``: transaction -> its decision's result,
    decline reason and the card status it read); ``changes``: how many the run started in
    all (None: unknown, and no decision is held to the last status)."""
    finding = Finding("a card's status judges every decision made after it commits")
    sent = [m for m in log if m.get("toggle") and m["expect"] in ("approved", "declined")]
    for m in sent:
        row = judged.get(m["txn"])
        if row is None:
            continue  # never decided: the accounting finding says so
        status = row["input_card_status"]
        by_status = ("APPROVED", None) if status == "ACTIVE" else ("DECLINED", "CARD_BLOCKED")
        if (row["result"], row["decline_reason"]) != by_status:
            finding.violations.append(f"{m['txn']}: {row['result']} {row['decline_reason']} "
                                      f"on a card it read {status}")
        started, completed, status_at_send, uncertain = m["toggle"]
        if started == completed == changes and not uncertain and status != status_at_send:
            finding.violations.append(f"{m['txn']}: sent after the last change ({status_at_send})"
                                      f" returned, read {status}")
    return finding
