"""The lifecycle phase's backlog: holds with what ends them, as a gateway sends them, an
issuer's day among them.

Each hold is an ``AUTHORIZATION`` followed, later in its account's stream, by one of seven
endings, in equal shares:

    cleared            CLEARING of the hold's amount (2 messages)
    partly reversed    REVERSAL of part of it, then CLEARING of the rest (3 messages)
    reversed           REVERSAL of the whole amount (2 messages)
    incremented        INCREMENTAL, then CLEARING of the amount with the increment (3)
    split shipment     CLEARING of a part with final: false, then the final one (3)
    abroad             the hold and its CLEARING in yen, billed in euros (2)
    partial approval   the hold asks more than its account of its own holds and is
                       approved for that balance; CLEARING of what was approved (2)

"Later" is a random number of positions (up to ``SPREAD``) after the message before it, so a
batch holds authorizations of some holds beside the endings of others, as a live stream does;
a hold's messages keep their order (same account: same partition). No orphan and no forced
clearing: the phase measures the common path, not the rare one. A partial approval's
account (``Backlog.thin``) is seeded with its balance before the backlog is sent.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from service.devtools.network_message import authorization_message

SPREAD = 2_000  # positions between a hold's messages, at most
ENDINGS = 7
MESSAGES_PER_HOLD = (2 + 3 + 2 + 3 + 3 + 2 + 2) / ENDINGS  # the mean over the endings
REVERSED_ENDING = 2  # the one ending that leaves its hold REVERSED (the others: CLEARED)
YEN_PER_EURO = 160


@dataclass
class Backlog:
    records: list[tuple[str, bytes]]  # (key, message), in the order to produce them
    thin: list[tuple[str, Decimal]] = field(default_factory=list)  # (account, balance)
    holds: int = 0


def messages(n: int, rng: random.Random, accounts: int, account_id: Callable[[int], str],
             prefix: str) -> Backlog:
    """About ``n`` messages (whole holds, so a few more at most), keyed by account.
    Transaction ids start with ``prefix``; so do the partial approvals' accounts."""
    timed: list[tuple[float, int, str, dict[str, Any]]] = []
    backlog = Backlog([], holds=round(n / MESSAGES_PER_HOLD))
    for h in range(backlog.holds):
        acc = account_id(rng.randrange(accounts))
        hold = f"{prefix}-A{h:08d}"
        cents = rng.randint(200, 20_000)
        amount = Decimal(cents) / 100
        asked = f"{amount:.2f}"  # the hold's amount as sent
        first: dict[str, Any] = {}  # and its other fields
        steps: list[tuple[str, str, str, dict[str, Any]]] = []  # (kind, txn, amount, more)
        ending = h % ENDINGS
        if ending == 0:
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", f"{amount:.2f}", {}))
        elif ending == 1:
            part = Decimal(rng.randint(1, cents - 1)) / 100
            steps.append(("REVERSAL", f"{prefix}-R{h:08d}", f"{part:.2f}", {}))
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", f"{amount - part:.2f}", {}))
        elif ending == REVERSED_ENDING:
            steps.append(("REVERSAL", f"{prefix}-R{h:08d}", f"{amount:.2f}", {}))
        elif ending == 3:
            more = Decimal(rng.randint(100, 10_000)) / 100
            steps.append(("INCREMENTAL", f"{prefix}-I{h:08d}", f"{more:.2f}", {}))
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", f"{amount + more:.2f}", {}))
        elif ending == 4:
            part = Decimal(rng.randint(1, cents - 1)) / 100
            steps.append(("CLEARING", f"{prefix}-S{h:08d}", f"{part:.2f}", {"final": False}))
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", f"{amount - part:.2f}",
                          {"final": True}))
        elif ending == 5:
            asked = f"{amount * YEN_PER_EURO:.0f}"
            first = {"currency": "JPY", "billing_amount": f"{amount:.2f}",
                     "billing_currency": "EUR"}
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", asked, first))
        else:
            acc = f"{prefix}-T{h:08d}"  # an account of its own, holding less than asked
            backlog.thin.append((acc, amount))
            first = {"partial_approval_supported": True}
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", f"{amount:.2f}", {}))
            asked = f"{amount + Decimal(rng.randint(1, 10_000)) / 100:.2f}"
        at = float(h)
        timed.append((at, 0, acc, authorization_message(
            hold, account_id=acc, amount=asked, authorization_type="AUTHORIZATION",
            **first)))
        for seq, (kind, txn, value, more_fields) in enumerate(steps, start=1):
            at += rng.uniform(1, SPREAD)
            timed.append((at, seq, acc, authorization_message(
                txn, account_id=acc, amount=value, authorization_type=kind,
                original_transaction_id=hold, **more_fields)))
    timed.sort(key=lambda item: (item[0], item[1]))
    backlog.records = [(acc, json.dumps(message).encode()) for _, _, acc, message in timed]
    return backlog
