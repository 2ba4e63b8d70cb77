"""The lifecycles the chaos load generator sends among its purchases: a hold with its
reversals and clearing, an advice, an orphan reversal before its original, a forced
clearing, a purchase reversed. Pure: a script is a list of messages with the time, in
seconds after the lifecycle starts, at which each is due; the generator sends them and logs
each one (see generator.py), the checker's model (lifecycle_model.py) reads that log.

Every message of a script is for one account, so one key, so one partition: the worker
decides them in the order they are sent, and the log's offsets say that order. The
outcomes stay known from the account alone: a rich account approves every authorization,
the empty one declines them (its available balance never rises above zero: it gets no
credit), and advices, reversals and clearings are never declined on a known account in
its currency.

``orphan_purchase_reversals`` (on by default): also send a REVERSAL of a PURCHASE before
the purchase. The contract applies it when the purchase arrives (a credit); one kept
waiting instead shows in the checker as a balance off by that credit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from service.devtools.network_message import authorization_message

CENT = Decimal("0.01")
Step = tuple[str, str, dict[str, Any], str]  # (kind, account, message, expect)


@dataclass(frozen=True)
class Planned:
    at: float        # seconds after the lifecycle's start
    kind: str        # the log's kind ("lc_…")
    account: str
    message: dict[str, Any]
    expect: str      # approved / declined


def _message(txn: str, account: str, amount: Decimal, auth_type: str,
             original: str | None = None, *, with_original: bool = True) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if with_original and original is not None:
        extra["original_transaction_id"] = original
    return authorization_message(txn, account_id=account, amount=f"{amount:.2f}",
                                 authorization_type=auth_type, **extra)


def _cents(rng: random.Random, low: Decimal, high: Decimal) -> Decimal:
    lo, hi = int(low / CENT), int(high / CENT)
    return Decimal(rng.randint(max(1, lo), max(1, hi))) * CENT


class Scripts:
    """Builds one lifecycle at a time: ``next(rich, empty)``."""

    def __init__(self, rng: random.Random, txn_id: Callable[[], str], *, span: float,
                 orphan_purchase_reversals: bool = True) -> None:
        self._rng = rng
        self._txn_id = txn_id
        self._span = span
        self._orphan_purchases = orphan_purchase_reversals
        self._scripts: list[tuple[float, Callable[[str, str], list[Step]]]] = [
            (0.20, self._hold_reversed_in_part_then_cleared),
            (0.12, self._hold_reversed_in_full),
            (0.10, self._hold_left_alone),
            (0.08, self._hold_cleared_late),
            (0.10, self._advice),
            (0.12, self._orphan_reversal_of_a_hold),
            (0.08, self._forced_clearing),
            (0.10, self._purchase_reversed),
            (0.05, self._declined_hold_reversed),
            (0.05, self._advice_past_the_available_balance),
        ]
        if orphan_purchase_reversals:
            self._scripts.append((0.06, self._orphan_reversal_of_a_purchase))

    def next(self, rich: str, empty: str) -> list[Planned]:
        script = self._rng.choices([s for _, s in self._scripts],
                                   weights=[w for w, _ in self._scripts])[0]
        steps = script(rich, empty)
        # the first message at once, the others spread over the span, in script order; a
        # script whose last step is "late" puts it at the span's end (past the expiry)
        times = sorted(self._rng.uniform(0, self._span) for _ in steps[1:])
        planned = []
        for i, (kind, account, message, expect) in enumerate(steps):
            at = 0.0 if i == 0 else times[i - 1]
            if kind.endswith("_late"):
                at = self._span
            planned.append(Planned(at, kind, account, message, expect))
        return planned

    # each script: [(kind, account, message, expect)] in the order they must be sent
    def _hold(self, account: str, kind: str = "AUTHORIZATION") -> tuple[str, Decimal, dict[
            str, Any]]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(10), Decimal(500))
        return txn, amount, _message(txn, account, amount, kind)

    def _reversal(self, account: str, original: str, amount: Decimal) -> dict[str, Any]:
        return _message(self._txn_id(), account, amount, "REVERSAL", original)

    def _clearing(self, account: str, original: str | None, amount: Decimal, *,
                  with_original: bool = True) -> dict[str, Any]:
        return _message(self._txn_id(), account, amount, "CLEARING", original,
                        with_original=with_original)

    def _hold_reversed_in_part_then_cleared(self, rich: str, _: str) -> list[Step]:
        txn, amount, auth = self._hold(rich)
        steps = [("lc_authorization", rich, auth, "approved")]
        left = amount
        for _i in range(self._rng.randint(1, 2)):
            part = _cents(self._rng, CENT, left / 2)
            left -= part
            steps.append(("lc_reversal_partial", rich, self._reversal(rich, txn, part),
                          "approved"))
        # the clearing over or under the hold (tips, FX)
        factor = Decimal(self._rng.choice(["0.7", "0.95", "1", "1.1", "1.3"]))
        cleared = max(CENT, (amount * factor).quantize(CENT))
        steps.append(("lc_clearing", rich, self._clearing(rich, txn, cleared), "approved"))
        if self._rng.random() < 0.3:  # after the end: releases nothing
            steps.append(("lc_reversal_after_end", rich, self._reversal(rich, txn, part),
                          "approved"))
        return steps

    def _hold_reversed_in_full(self, rich: str, _: str) -> list[Step]:
        txn, amount, auth = self._hold(rich)
        steps = [("lc_authorization", rich, auth, "approved")]
        if self._rng.random() < 0.5:
            steps.append(("lc_reversal_full", rich, self._reversal(rich, txn, amount),
                          "approved"))
        else:  # a partial one, then one for more than remains: capped
            part = _cents(self._rng, CENT, amount / 2)
            steps.append(("lc_reversal_partial", rich, self._reversal(rich, txn, part),
                          "approved"))
            steps.append(("lc_reversal_over", rich, self._reversal(rich, txn, amount),
                          "approved"))
        if self._rng.random() < 0.4:  # a clearing after the full reversal: still posts
            steps.append(("lc_clearing_after_end", rich,
                          self._clearing(rich, txn, amount), "approved"))
        return steps

    def _hold_left_alone(self, rich: str, _: str) -> list[Step]:
        _txn, _amount, auth = self._hold(rich)
        return [("lc_authorization", rich, auth, "approved")]

    def _hold_cleared_late(self, rich: str, _: str) -> list[Step]:
        txn, amount, auth = self._hold(rich)
        return [("lc_authorization", rich, auth, "approved"),
                ("lc_clearing_late", rich, self._clearing(rich, txn, amount), "approved")]

    def _advice(self, rich: str, _: str) -> list[Step]:
        txn, amount, advice = self._hold(rich, "ADVICE")
        steps = [("lc_advice", rich, advice, "approved")]
        if self._rng.random() < 0.5:
            steps.append(("lc_clearing", rich, self._clearing(rich, txn, amount), "approved"))
        else:
            steps.append(("lc_reversal_partial", rich,
                          self._reversal(rich, txn, _cents(self._rng, CENT, amount)),
                          "approved"))
        return steps

    def _orphan_reversal_of_a_hold(self, rich: str, _: str) -> list[Step]:
        txn, amount, auth = self._hold(rich)
        part = amount if self._rng.random() < 0.4 else _cents(self._rng, CENT, amount)
        steps = [("lc_orphan_reversal", rich, self._reversal(rich, txn, part), "approved"),
                 ("lc_authorization_after_orphan", rich, auth, "approved")]
        if self._rng.random() < 0.5:
            steps.append(("lc_clearing", rich, self._clearing(rich, txn, amount), "approved"))
        return steps

    def _forced_clearing(self, rich: str, _: str) -> list[Step]:
        amount = _cents(self._rng, Decimal(1), Decimal(300))
        if self._rng.random() < 0.5:  # no original at all
            return [("lc_clearing_forced", rich,
                     self._clearing(rich, None, amount, with_original=False), "approved")]
        # an original no message ever placed
        return [("lc_clearing_forced", rich,
                 self._clearing(rich, self._txn_id() + "-never", amount), "approved")]

    def _purchase_reversed(self, rich: str, _: str) -> list[Step]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(5), Decimal(400))
        part = _cents(self._rng, CENT, amount / 2)
        return [("lc_purchase", rich, _message(txn, rich, amount, "PURCHASE"), "approved"),
                ("lc_purchase_reversal", rich, self._reversal(rich, txn, part), "approved"),
                ("lc_purchase_reversal", rich, self._reversal(rich, txn, amount), "approved")]

    def _orphan_reversal_of_a_purchase(self, rich: str, _: str) -> list[Step]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(5), Decimal(400))
        part = _cents(self._rng, CENT, amount)
        return [("lc_orphan_purchase_reversal", rich, self._reversal(rich, txn, part),
                 "approved"),
                ("lc_purchase", rich, _message(txn, rich, amount, "PURCHASE"), "approved")]

    def _declined_hold_reversed(self, _: str, empty: str) -> list[Step]:
        txn, amount, auth = self._hold(empty)
        return [("lc_authorization_declined", empty, auth, "declined"),
                ("lc_reversal_of_declined", empty, self._reversal(empty, txn, amount),
                 "approved")]

    def _advice_past_the_available_balance(self, _: str, empty: str) -> list[Step]:
        txn, amount, advice = self._hold(empty, "ADVICE")
        steps = [("lc_advice_past_available", empty, advice, "approved")]
        if self._rng.random() < 0.5:  # the ledger balance below zero: only a clearing
            steps.append(("lc_clearing", empty, self._clearing(empty, txn, amount),
                          "approved"))
        return steps
