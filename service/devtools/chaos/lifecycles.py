"""The lifecycles the chaos load generator sends among its purchases: a hold with its
reversals and clearing, an advice, an orphan reversal before its original, a forced
clearing, a purchase reversed; and an issuer's day: verifications and balance inquiries, a
hotel hold with increments, a split shipment (non-final clearings), purchases and holds
abroad (a billing amount in the account's currency), a clearing before its hold, partial
approvals. Pure: a script is a list of messages with the time, in seconds after the
lifecycle starts, at which each is due; the generator sends them and logs each one (see
generator.py), the checker's model (lifecycle_model.py) reads that log.

Every message of a script is for one account, so one key, so one partition: the worker
decides them in the order they are sent, and the log's offsets say that order. The
outcomes stay known from the account alone: a rich account approves every authorization
and increment, the empty one declines them (its available balance never rises above zero:
it gets no credit), and advices, reversals and clearings are never declined on a known
account in its currency. A partial approval goes to an account of its own (``partial``:
each used once, its balance known), so what it approves is known too. One outcome is not
the log's to know: an increment of a hold the run's expiry ended first is declined
HOLD_NOT_ACTIVE (the checker accepts that for a hold the database says expired).

``orphan_purchase_reversals`` (on by default): also send a REVERSAL of a PURCHASE before
the purchase. The contract applies it when the purchase arrives (a credit); one kept
waiting instead shows in the checker as a balance off by that credit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from service.devtools.network_message import authorization_message

CENT = Decimal("0.01")
# (kind, account, message, expect[, what a partial approval approves])
Step = tuple[str, str, dict[str, Any], str] | tuple[str, str, dict[str, Any], str, str]


@dataclass(frozen=True)
class Planned:
    at: float        # seconds after the lifecycle's start
    kind: str        # the log's kind ("lc_…")
    account: str
    message: dict[str, Any]
    expect: str      # approved / declined
    approved: str | None = None  # a partial approval's amount


def _message(txn: str, account: str, amount: Decimal, auth_type: str,
             original: str | None = None, *, with_original: bool = True,
             **fields: Any) -> dict[str, Any]:
    extra: dict[str, Any] = dict(fields)
    if with_original and original is not None:
        extra["original_transaction_id"] = original
    return authorization_message(txn, account_id=account, amount=f"{amount:.2f}",
                                 authorization_type=auth_type, **extra)


def _abroad(amount_eur: Decimal) -> dict[str, Any]:
    """Sent in yen, billed in the account's euros: the billing amount moves."""
    return {"currency": "JPY", "billing_amount": f"{amount_eur:.2f}", "billing_currency": "EUR"}


def _cents(rng: random.Random, low: Decimal, high: Decimal) -> Decimal:
    lo, hi = int(low / CENT), int(high / CENT)
    return Decimal(rng.randint(max(1, lo), max(1, hi))) * CENT


class Scripts:
    """Builds one lifecycle at a time: ``next(rich, empty)``."""

    def __init__(self, rng: random.Random, txn_id: Callable[[], str], *, span: float,
                 orphan_purchase_reversals: bool = True,
                 partial: list[tuple[str, Decimal]] | None = None) -> None:
        self._rng = rng
        self._txn_id = txn_id
        self._span = span
        self._orphan_purchases = orphan_purchase_reversals
        self._partial = list(partial or [])  # (account, balance), each used once
        self._scripts: list[tuple[float, Callable[[str, str], Sequence[Step]]]] = [
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
            (0.05, self._verification_and_inquiry),
            (0.08, self._hotel_hold_incremented),
            (0.06, self._split_shipment),
            (0.06, self._abroad),
            (0.05, self._clearing_before_its_hold),
            (0.03, self._increment_of_a_declined_hold),
            (0.05, self._partial_approval),
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
        for i, (kind, account, message, expect, *approved) in enumerate(steps):
            at = 0.0 if i == 0 else times[i - 1]
            if kind.endswith("_late"):
                at = self._span
            planned.append(Planned(at, kind, account, message, expect,
                                   approved[0] if approved else None))
        return planned

    # each script: [(kind, account, message, expect)] in the order they must be sent
    def _hold(self, account: str, kind: str = "AUTHORIZATION") -> tuple[str, Decimal, dict[
            str, Any]]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(10), Decimal(500))
        return txn, amount, _message(txn, account, amount, kind)

    def _reversal(self, account: str, original: str, amount: Decimal, **fields: Any
                  ) -> dict[str, Any]:
        return _message(self._txn_id(), account, amount, "REVERSAL", original, **fields)

    def _clearing(self, account: str, original: str | None, amount: Decimal, *,
                  with_original: bool = True, **fields: Any) -> dict[str, Any]:
        return _message(self._txn_id(), account, amount, "CLEARING", original,
                        with_original=with_original, **fields)

    def _increment(self, account: str, original: str, amount: Decimal) -> dict[str, Any]:
        return _message(self._txn_id(), account, amount, "INCREMENTAL", original)

    def _partial_reversal(self, account: str, original: str, up_to: Decimal) -> Step:
        return ("lc_reversal_partial", account,
                self._reversal(account, original, _cents(self._rng, CENT, up_to)), "approved")

    def _hold_reversed_in_part_then_cleared(self, rich: str, _: str) -> Sequence[Step]:
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

    def _hold_reversed_in_full(self, rich: str, _: str) -> Sequence[Step]:
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

    def _hold_left_alone(self, rich: str, _: str) -> Sequence[Step]:
        _txn, _amount, auth = self._hold(rich)
        return [("lc_authorization", rich, auth, "approved")]

    def _hold_cleared_late(self, rich: str, _: str) -> Sequence[Step]:
        txn, amount, auth = self._hold(rich)
        return [("lc_authorization", rich, auth, "approved"),
                ("lc_clearing_late", rich, self._clearing(rich, txn, amount), "approved")]

    def _advice(self, rich: str, _: str) -> Sequence[Step]:
        txn, amount, advice = self._hold(rich, "ADVICE")
        steps: list[Step] = [("lc_advice", rich, advice, "approved")]
        if self._rng.random() < 0.5:
            steps.append(("lc_clearing", rich, self._clearing(rich, txn, amount), "approved"))
        else:
            steps.append(self._partial_reversal(rich, txn, amount))
        return steps

    def _orphan_reversal_of_a_hold(self, rich: str, _: str) -> Sequence[Step]:
        txn, amount, auth = self._hold(rich)
        part = amount if self._rng.random() < 0.4 else _cents(self._rng, CENT, amount)
        steps = [("lc_orphan_reversal", rich, self._reversal(rich, txn, part), "approved"),
                 ("lc_authorization_after_orphan", rich, auth, "approved")]
        if self._rng.random() < 0.5:
            steps.append(("lc_clearing", rich, self._clearing(rich, txn, amount), "approved"))
        return steps

    def _forced_clearing(self, rich: str, _: str) -> Sequence[Step]:
        amount = _cents(self._rng, Decimal(1), Decimal(300))
        if self._rng.random() < 0.5:  # no original at all
            return [("lc_clearing_forced", rich,
                     self._clearing(rich, None, amount, with_original=False), "approved")]
        # an original no message ever placed
        return [("lc_clearing_forced", rich,
                 self._clearing(rich, self._txn_id() + "-never", amount), "approved")]

    def _purchase_reversed(self, rich: str, _: str) -> Sequence[Step]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(5), Decimal(400))
        part = _cents(self._rng, CENT, amount / 2)
        return [("lc_purchase", rich, _message(txn, rich, amount, "PURCHASE"), "approved"),
                ("lc_purchase_reversal", rich, self._reversal(rich, txn, part), "approved"),
                ("lc_purchase_reversal", rich, self._reversal(rich, txn, amount), "approved")]

    def _orphan_reversal_of_a_purchase(self, rich: str, _: str) -> Sequence[Step]:
        txn = self._txn_id()
        amount = _cents(self._rng, Decimal(5), Decimal(400))
        part = _cents(self._rng, CENT, amount)
        return [("lc_orphan_purchase_reversal", rich, self._reversal(rich, txn, part),
                 "approved"),
                ("lc_purchase", rich, _message(txn, rich, amount, "PURCHASE"), "approved")]

    def _declined_hold_reversed(self, _: str, empty: str) -> Sequence[Step]:
        txn, amount, auth = self._hold(empty)
        return [("lc_authorization_declined", empty, auth, "declined"),
                ("lc_reversal_of_declined", empty, self._reversal(empty, txn, amount),
                 "approved")]

    def _advice_past_the_available_balance(self, _: str, empty: str) -> Sequence[Step]:
        txn, amount, advice = self._hold(empty, "ADVICE")
        steps: list[Step] = [("lc_advice_past_available", empty, advice, "approved")]
        if self._rng.random() < 0.4:  # more on a hold the account cannot fund: declined
            steps.append(("lc_increment_no_funds", empty,
                          self._increment(empty, txn, amount),
                          "declined"))
        if self._rng.random() < 0.5:  # the ledger balance below zero: only a clearing
            steps.append(("lc_clearing", empty, self._clearing(empty, txn, amount),
                          "approved"))
        return steps

    # ------------------------------------------------------------ an issuer's day
    def _verification_and_inquiry(self, rich: str, empty: str) -> Sequence[Step]:
        """Neither moves money; a verification needs no funds (on the empty account too)."""
        def zero(account: str, kind: str) -> dict[str, Any]:
            return _message(self._txn_id(), account, Decimal(0), kind)

        if self._rng.random() < 0.3:
            return [("lc_verification", empty, zero(empty, "VERIFICATION"), "approved")]
        return [("lc_verification", rich, zero(rich, "VERIFICATION"), "approved"),
                ("lc_balance_inquiry", rich, zero(rich, "BALANCE_INQUIRY"), "approved")]

    def _hotel_hold_incremented(self, rich: str, _: str) -> Sequence[Step]:
        txn, amount, auth = self._hold(rich)
        steps: list[Step] = [("lc_authorization", rich, auth, "approved")]
        total = amount
        for _i in range(self._rng.randint(1, 3)):
            more = _cents(self._rng, Decimal(1), Decimal(200))
            total += more
            steps.append(("lc_increment", rich,
                          self._increment(rich, txn, more), "approved"))
        roll = self._rng.random()
        if roll < 0.6:  # checked out: cleared at about what was held
            factor = Decimal(self._rng.choice(["0.9", "1", "1.05"]))
            steps.append(("lc_clearing", rich,
                          self._clearing(rich, txn, max(CENT, (total * factor).quantize(CENT))),
                          "approved"))
        elif roll < 0.8:
            steps.append(self._partial_reversal(rich, txn, total))
        return steps

    def _split_shipment(self, rich: str, _: str) -> Sequence[Step]:
        """Parcels cleared one by one (final: false), the last one final, or never."""
        txn, amount, auth = self._hold(rich)
        steps: list[Step] = [("lc_authorization", rich, auth, "approved")]
        left = amount
        for _i in range(self._rng.randint(1, 3)):
            parcel = _cents(self._rng, CENT, left / 2)
            left -= parcel
            steps.append(("lc_clearing_partial", rich,
                          self._clearing(rich, txn, parcel, final=False),
                          "approved"))
        if self._rng.random() < 0.8:
            steps.append(("lc_clearing", rich,
                          self._clearing(rich, txn, left, final=True),
                          "approved"))
        return steps

    def _abroad(self, rich: str, _: str) -> Sequence[Step]:
        """A purchase or a hold sent in yen: the network's billing amount in euros moves."""
        txn = self._txn_id()
        euros = _cents(self._rng, Decimal(5), Decimal(400))
        yen = (euros * 160).quantize(Decimal(1))
        if self._rng.random() < 0.4:
            return [("lc_purchase_abroad", rich,
                     _message(txn, rich, yen, "PURCHASE", **_abroad(euros)), "approved")]
        steps: list[Step] = [("lc_authorization_abroad", rich,
                              _message(txn, rich, yen, "AUTHORIZATION", **_abroad(euros)),
                              "approved")]
        if self._rng.random() < 0.3:
            part = _cents(self._rng, CENT, euros / 2)
            steps.append(("lc_reversal_abroad", rich,
                          self._reversal(rich, txn, (part * 160).quantize(Decimal(1)),
                                        **_abroad(part)), "approved"))
        rate = Decimal(self._rng.choice(["1", "1.02", "0.97"]))  # the rate moved by clearing
        cleared = (euros * rate).quantize(CENT)
        steps.append(("lc_clearing_abroad", rich,
                      self._clearing(rich, txn, yen, **_abroad(cleared)),
                      "approved"))
        return steps

    def _clearing_before_its_hold(self, rich: str, _: str) -> Sequence[Step]:
        """The clearing overtakes its hold (a stand-in decision's advice comes late): it
        posts at once, and the hold is placed net of it."""
        txn, amount, hold = self._hold(rich, self._rng.choice(["ADVICE", "AUTHORIZATION"]))
        final = self._rng.random() < 0.6
        cleared = amount if final else _cents(self._rng, CENT, amount)
        kind = str(hold["body"]["authorization_type"]).lower()
        return [("lc_clearing_early", rich,
                 self._clearing(rich, txn, cleared, final=final),
                 "approved"),
                (f"lc_{kind}_after_clearing", rich, hold, "approved")]

    def _increment_of_a_declined_hold(self, _: str, empty: str) -> Sequence[Step]:
        txn, amount, auth = self._hold(empty)
        return [("lc_authorization_declined", empty, auth, "declined"),
                ("lc_increment_not_active", empty,
                 self._increment(empty, txn, amount), "declined")]

    def _partial_approval(self, rich: str, empty: str) -> Sequence[Step]:
        """A purchase or hold for more than an account of its own holds: approved for its
        balance (``approved`` in the log). With none left, on the empty account: declined
        (nothing available), and on a rich one: approved whole."""
        kind = self._rng.choice(["PURCHASE", "AUTHORIZATION"])
        if not self._partial:
            account, expect = (empty, "declined") if self._rng.random() < 0.5 else \
                (rich, "approved")
            return [(f"lc_partial_{kind.lower()}_whole_or_none", account,
                     _message(self._txn_id(), account, _cents(self._rng, CENT, Decimal(300)),
                              kind, partial_approval_supported=True), expect)]
        account, balance = self._partial.pop()
        asked = balance + _cents(self._rng, CENT, Decimal(300))
        txn = self._txn_id()
        steps: list[Step] = [(f"lc_partial_{kind.lower()}", account,
                              _message(txn, account, asked, kind,
                                       partial_approval_supported=True),
                              "approved", f"{balance:.2f}")]
        if kind == "AUTHORIZATION" and self._rng.random() < 0.5:
            steps.append(("lc_clearing", account, self._clearing(account, txn, balance),
                          "approved"))
        return steps
