"""The contract's money, modelled apart from the SQL that implements it (a model that copied
the SQL would agree with its bugs): each account's ledger balance and held amount, each
hold's life and end, each transaction's ledger entry, and what each decision's events say
it changed. Pure.

``Book`` applies messages in the order the worker decides them:

- PURCHASE debits, REFUND credits what was approved (the whole amount, or for a partial
  approval the available balance); VERIFICATION and BALANCE_INQUIRY move nothing;
- AUTHORIZATION/ADVICE approved: a hold of what was approved, net of the orphan reversals
  and the clearings that named it before it came, in the one order they came in, each as
  if the hold had been there: a reversal releases up to what remains, and the hold ends
  REVERSED at zero, at once, by no message; a clearing releases as much as it posted, a
  final one everything (the hold is placed CLEARED by it); after the end, either releases
  nothing; declined: those orphans and clearings change nothing;
- INCREMENTAL approved: adds what was approved to its hold;
- REVERSAL of an active hold: releases up to what remains (capped); what remains reaching
  zero ends the hold REVERSED by it; of an ended hold or a declined original: nothing; of
  a PURCHASE: credits up to what of it is not yet credited back; of an original not seen
  yet: waits (an orphan), to be applied when the original comes (to a purchase too);
- CLEARING: debits its amount whatever happens; a final one ends its original's hold
  CLEARED if it is still active, whatever remains; a non-final one releases as much as it
  posts (capped) and the hold stays; without one (forced) or after the end: only the debit;
  naming an original not seen yet: kept for it;
- amounts move in the account's currency: the amount, or the network's billing amount;
- expiry is the one effect not in a message: the checker learns it from the database. It
  ends what remains of an active hold, so an expired hold keeps nothing, and what it
  released is what remained at some point of the hold's active life
  (``Hold.while_active``); a reversal after it releases nothing and a clearing after it
  ends nothing (nothing here changes: the ledger does not see holds).

``implied_by(log)`` applies the chaos load's ground-truth log, each message approved or
declined as the log expects it (the generator sends only what it can foresee); ``Book.
decide`` decides a message itself, by the contract's rule, against the accounts as the
book has them (the model test holds the worker to it on random streams of every kind).

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
_LIFECYCLE = {"AUTHORIZATION", "ADVICE", "REVERSAL", "CLEARING", "INCREMENTAL"}
_HOLDS = {"AUTHORIZATION", "ADVICE"}


@dataclass
class Hold:
    txn: str
    account: str
    amount: Decimal
    remaining: Decimal
    state: str = "ACTIVE"          # or REVERSED / CLEARED (EXPIRED only the database knows)
    ended_by: str | None = None    # the message that ended it
    ended_on_arrival: bool = False  # by a clearing that came before it (whose own record,
    #                                 decided when there was no hold, ended none)
    while_active: list[Decimal] = field(default_factory=list)  # what an expiry could release
    incremented: Decimal = ZERO


@dataclass(frozen=True)
class Waiting:
    """A REVERSAL or a CLEARING that named an original not seen yet, kept for it."""

    txn: str
    amount: Decimal
    final: bool | None  # a clearing's; None: a reversal (an orphan)


@dataclass
class Account:
    """What the rule reads of an account (the book keeps its balances)."""

    opening: Decimal
    status: str = "ACTIVE"
    currency: str = "EUR"


@dataclass
class Effect:
    """What a decision changed, as its events must say: its own deltas, and each orphan
    reversal its arrival applied (reversal, what it applied, its balance and held deltas)."""

    result: str                      # APPROVED / DECLINED
    reason: str | None = None
    approved: Decimal | None = None  # in the account's currency
    balance_delta: Decimal = ZERO
    held_delta: Decimal = ZERO
    applied: list[tuple[str, Decimal, Decimal, Decimal]] = field(default_factory=list)
    already_cleared: Decimal | None = None


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


def account_amount(m: dict[str, Any], currency: str) -> Decimal | None:
    """What a message moves in its account's currency (the contract's "Conversion")."""
    if m.get("currency", "EUR") == currency:
        return Decimal(m["amount"])
    if m.get("billing_currency") == currency and m.get("billing_amount") is not None:
        return Decimal(m["billing_amount"])
    return None


class Book:
    def __init__(self, accounts: dict[str, Account] | None = None) -> None:
        self.accounts = accounts or {}
        self.delta: dict[str, Decimal] = defaultdict(Decimal)
        self.holds: dict[str, Hold] = {}
        self.ledger: dict[str, Decimal] = {}
        self.purchases: dict[str, tuple[Decimal, Decimal]] = {}  # txn: (approved, credited)
        self.kinds: dict[str, tuple[str, str, str]] = {}  # txn: (kind, account, result)
        # per original not seen yet: the reversals and clearings that named it, in order
        self.waiting: dict[str, list[Waiting]] = defaultdict(list)
        self.lifecycle = 0

    # ------------------------------------------------------------------ reading
    def held_by(self, account: str) -> Decimal:
        return sum((h.remaining for h in self.holds.values()
                    if h.account == account and h.state == "ACTIVE"), ZERO)

    def available(self, account: str) -> Decimal:
        return self.accounts[account].opening + self.delta[account] - self.held_by(account)

    def expected(self) -> Expected:
        return Expected(dict(self.delta), self.holds, self.ledger,
                        sum(w.final is None for v in self.waiting.values() for w in v),
                        self.lifecycle)

    # ----------------------------------------------------------------- deciding
    def decide(self, m: dict[str, Any]) -> tuple[str, str | None, Decimal | None]:
        """(result, decline reason, what is approved) for a message, by the contract's rule,
        against the account as the book has it now; ("MISMATCH", why, None) for one the
        worker dead-letters LIFECYCLE_MISMATCH."""
        kind, account = m["type"], m["key"]
        original = m.get("original")
        known = self.kinds.get(original) if original else None
        if kind in ("REVERSAL", "CLEARING") and known is not None:
            if known[0] not in ("PURCHASE", "AUTHORIZATION", "ADVICE") or \
                    (kind == "CLEARING" and known[0] == "PURCHASE"):
                return "MISMATCH", f"the original is a {known[0]}", None
            if known[1] != account:
                return "MISMATCH", "the original is of another account", None
        acct = self.accounts.get(account)
        if acct is None:
            if kind == "CLEARING":
                return "MISMATCH", "unknown account", None
            if kind == "REVERSAL":
                return "APPROVED", None, Decimal(m["amount"])
            return "DECLINED", "UNKNOWN_ACCOUNT", None
        amount = account_amount(m, acct.currency)
        if kind in ("ADVICE", "REVERSAL", "CLEARING"):
            if amount is None:
                return "MISMATCH", "no billing_amount in the account's currency", None
            return "APPROVED", None, amount
        if acct.status != "ACTIVE":
            return "DECLINED", "ACCOUNT_BLOCKED", None
        if kind == "BALANCE_INQUIRY":
            return "APPROVED", None, amount if amount is not None else ZERO
        if amount is None:
            return "DECLINED", "CURRENCY_MISMATCH", None
        if kind == "INCREMENTAL":
            hold = self.holds.get(original or "")
            if hold is None or hold.account != account or hold.state != "ACTIVE":
                return "DECLINED", "HOLD_NOT_ACTIVE", None
        if kind in ("REFUND", "VERIFICATION"):
            return "APPROVED", None, amount
        available = self.available(account)
        if available >= amount:
            return "APPROVED", None, amount
        if m.get("partial") and kind in ("PURCHASE", "AUTHORIZATION") and available > 0:
            return "APPROVED", None, available
        return "DECLINED", "INSUFFICIENT_FUNDS", None

    # ----------------------------------------------------------------- applying
    def _post(self, txn: str, account: str, amount: Decimal) -> None:
        self.delta[account] += amount
        self.ledger[txn] = amount

    def _credit_back(self, txn: str, account: str, purchase: str, amount: Decimal) -> Decimal:
        total, credited = self.purchases[purchase]
        applied = min(amount, total - credited)
        self.purchases[purchase] = (total, credited + applied)
        if applied > 0:
            self._post(txn, account, applied)
        return applied

    def apply(self, m: dict[str, Any], result: str, reason: str | None,
              approved: Decimal | None) -> Effect:
        """What the decided message changes, given its decision (``approved``: in the
        account's currency; for a message that moves its amount whole, the amount)."""
        txn, account, kind = m["txn"], m["key"], m["type"]
        original = m.get("original")
        effect = Effect(result, reason, approved)
        if result == "MISMATCH":
            return effect
        self.kinds[txn] = (kind, account, result)
        self.lifecycle += kind in _LIFECYCLE
        currency = self.accounts[account].currency if account in self.accounts else "EUR"
        amount = account_amount(m, currency)
        if result != "APPROVED":  # what waited for it is void: it changes nothing
            self.waiting.pop(txn, None)
            return effect
        granted = approved if approved is not None else (amount or ZERO)
        if kind in ("PURCHASE", "REFUND"):
            effect.balance_delta = -granted if kind == "PURCHASE" else granted
            self._post(txn, account, effect.balance_delta)
            if kind == "PURCHASE":
                self.purchases[txn] = (granted, ZERO)
                for w in self.waiting.pop(txn, []):
                    if w.final is None:  # (a clearing waiting for a purchase is void)
                        credited = self._credit_back(w.txn, account, txn, w.amount)
                        effect.applied.append((w.txn, credited, credited, ZERO))
            self.waiting.pop(txn, None)
        elif kind in ("VERIFICATION", "BALANCE_INQUIRY"):
            self.waiting.pop(txn, None)
        elif kind in _HOLDS:
            placed, cleared, state, cleared_by = granted, ZERO, "ACTIVE", None
            waited = self.waiting.pop(txn, [])
            for w in waited:
                if w.final is None:  # an orphan reversal
                    applied = min(w.amount, placed) if state == "ACTIVE" else ZERO
                    effect.applied.append((w.txn, applied, ZERO, -applied))
                    if state == "ACTIVE" and placed == applied:
                        state = "REVERSED"
                else:  # a clearing that came before it
                    applied = (ZERO if state != "ACTIVE" else placed if w.final
                               else min(w.amount, placed))
                    cleared += applied
                    if state == "ACTIVE" and w.final:
                        state, cleared_by = "CLEARED", w.txn
                placed -= applied
            hold = Hold(txn, account, granted, placed, state)
            if state == "CLEARED":
                hold.ended_by, hold.ended_on_arrival = cleared_by, True
            elif state == "ACTIVE":
                hold.while_active.append(placed)
            self.holds[txn] = hold
            effect.held_delta = granted - cleared
            if any(w.final is not None for w in waited):
                effect.already_cleared = cleared
        elif kind == "INCREMENTAL":
            increased = self.holds[original or ""]
            increased.remaining += granted
            increased.incremented += granted
            increased.while_active.append(increased.remaining)
            effect.held_delta = granted
        elif kind == "REVERSAL":
            assert original is not None, f"{txn}: a REVERSAL names its original"
            named = self.holds.get(original)
            if named is not None:
                hold = named
                if hold.state == "ACTIVE":
                    released = min(granted, hold.remaining)
                    hold.remaining -= released
                    effect.held_delta = -released
                    if hold.remaining == 0:
                        hold.state, hold.ended_by = "REVERSED", txn
                    else:
                        hold.while_active.append(hold.remaining)
            elif original in self.purchases:
                effect.balance_delta = self._credit_back(txn, account, original, granted)
            elif original not in self.kinds:
                self.waiting[original].append(Waiting(txn, granted, None))
        elif kind == "CLEARING":
            self._post(txn, account, -granted)
            effect.balance_delta = -granted
            cleared_hold = self.holds.get(original) if original else None
            final = m.get("final") is not False
            if cleared_hold is not None and cleared_hold.state == "ACTIVE":
                released = cleared_hold.remaining if final \
                    else min(granted, cleared_hold.remaining)
                cleared_hold.remaining -= released
                effect.held_delta = -released
                if final:
                    cleared_hold.state, cleared_hold.ended_by = "CLEARED", txn
                else:
                    cleared_hold.while_active.append(cleared_hold.remaining)
            elif original is not None and original not in self.kinds:
                self.waiting[original].append(Waiting(txn, granted, final))
        return effect


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
    """The money the chaos load's log implies, each message decided as the log expects
    (``approved`` in a line: what a partial approval approves)."""
    book = Book()
    for m in decided_in_order(log):
        approved = Decimal(m["approved"]) if m.get("approved") is not None else None
        book.apply(m, "APPROVED" if m["expect"] == "approved" else "DECLINED", None, approved)
    return book.expected()
