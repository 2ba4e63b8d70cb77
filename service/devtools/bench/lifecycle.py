"""The lifecycle phase's backlog: holds with what ends them, as a gateway sends them.

Each hold is an ``AUTHORIZATION`` followed, later in its account's stream, by one of three
endings, in equal shares:

    cleared            CLEARING of the hold's amount (2 messages)
    partly reversed    REVERSAL of part of it, then CLEARING of the rest (3 messages)
    reversed           REVERSAL of the whole amount (2 messages)

"Later" is a random number of positions (up to ``SPREAD``) after the message before it, so a
batch holds authorizations of some holds beside the endings of others, as a live stream does;
a hold's messages keep their order (same account: same partition). No orphan and no forced
clearing: the phase measures the common path, not the rare one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from decimal import Decimal

from service.devtools.network_message import authorization_message

SPREAD = 2_000  # positions between a hold's messages, at most
MESSAGES_PER_HOLD = 7 / 3  # the mean over the three endings


def messages(n: int, rng: random.Random, accounts: int, account_id: Callable[[int], str],
             prefix: str) -> list[tuple[str, bytes]]:
    """About ``n`` messages (whole holds, so a few more at most), keyed by account, in the
    order to produce them. Transaction ids start with ``prefix``."""
    timed: list[tuple[float, int, str, dict[str, object]]] = []
    holds = round(n / MESSAGES_PER_HOLD)
    for h in range(holds):
        acc = account_id(rng.randrange(accounts))
        hold = f"{prefix}-A{h:08d}"
        cents = rng.randint(200, 20_000)
        amount = Decimal(cents) / 100
        at = float(h)
        steps: list[tuple[str, str, Decimal]] = [("AUTHORIZATION", hold, amount)]
        ending = h % 3
        if ending == 0:
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", amount))
        elif ending == 1:
            part = Decimal(rng.randint(1, cents - 1)) / 100
            steps.append(("REVERSAL", f"{prefix}-R{h:08d}", part))
            steps.append(("CLEARING", f"{prefix}-C{h:08d}", amount - part))
        else:
            steps.append(("REVERSAL", f"{prefix}-R{h:08d}", amount))
        for seq, (kind, txn, value) in enumerate(steps):
            if seq:
                at += rng.uniform(1, SPREAD)
            extra = {} if kind == "AUTHORIZATION" else {"original_transaction_id": hold}
            timed.append((at, seq, acc, authorization_message(
                txn, account_id=acc, amount=f"{value:.2f}", authorization_type=kind, **extra)))
    timed.sort(key=lambda item: (item[0], item[1]))
    return [(acc, json.dumps(message).encode()) for _, _, acc, message in timed]
