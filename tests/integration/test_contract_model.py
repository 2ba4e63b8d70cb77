"""The contract's model (``service/devtools/chaos/lifecycle_model.py``, the one the chaos
checker holds runs to) decides random streams of every kind, and a real worker decides the
same streams through the broker: every decision (result, reason, what was approved), every
event's deltas (and each ``ReversalApplied``), every dead letter, and every account's
balance and held amount agree.

Each account's messages share its key, so its partition: the worker decides them in the
order they are sent, as the model does; originals are always of the message's own account
(another account's key is another partition, in an order nobody knows)."""

from __future__ import annotations

import asyncio
import random
import uuid
from decimal import Decimal
from typing import Any

import pytest

from service.devtools.chaos.lifecycle_model import Account, Book, Effect
from tests.support import lifecycle as lc
from tests.support import stack
from tests.support.factory import encode
from tests.support.workers import wait_caught_up

CENT = Decimal("0.01")
ACCOUNTS = {  # suffix: (opening, status)
    "rich": ("5000.00", "ACTIVE"), "mid": ("900.00", "ACTIVE"), "poor": ("150.00", "ACTIVE"),
    "zero": ("0.00", "ACTIVE"), "blocked": ("500.00", "BLOCKED"),
}


class RandomDay:
    """A random day of every kind on a few accounts, each message a dict of the fields the
    model reads (``txn``, ``key``, ``type``, ``amount``, ``currency``, ``original``,
    ``billing_amount``, ``billing_currency``, ``partial``, ``final``). It looks at the book
    to aim most increments, reversals and clearings at holds still active (aimed at random,
    most would land on a hold already ended or declined, and decide nothing)."""

    def __init__(self, seed: int, accounts: list[str], tag: str) -> None:
        self.rng = random.Random(seed)
        self.accounts = accounts
        self.tag = tag
        self.n = 0
        self.holds: dict[str, list[str]] = {a: [] for a in accounts}
        self.purchases: dict[str, list[str]] = {a: [] for a in accounts}
        self.others: dict[str, list[str]] = {a: [] for a in accounts}  # no hold, no purchase
        self.later: dict[str, list[dict[str, Any]]] = {a: [] for a in accounts}

    def _txn(self) -> str:
        self.n += 1
        return f"MD-{self.tag}-{self.n:04d}"

    def _amount(self, low: int = 1, high: int = 400) -> str:
        return f"{Decimal(self.rng.randint(low * 100, high * 100)) * CENT:.2f}"

    def _hold(self, account: str, book: Book) -> str | None:
        """A hold of the account: mostly one still active, else any (ended, declined)."""
        live = [h for h in self.holds[account]
                if h in book.holds and book.holds[h].state == "ACTIVE"]
        if live and self.rng.random() < 0.8:
            return self.rng.choice(live)
        return self.rng.choice(self.holds[account]) if self.holds[account] else None

    def message(self, book: Book) -> dict[str, Any]:
        rng = self.rng
        account = rng.choice(self.accounts)
        if self.later[account] and rng.random() < 0.15:  # an original that came late
            return self.later[account].pop(0)
        m: dict[str, Any] = {"txn": self._txn(), "key": account, "currency": "EUR"}
        roll = rng.random()
        hold = self._hold(account, book)
        purchases = self.purchases[account]
        if roll < 0.16:
            m.update(type="PURCHASE", amount=self._amount(), partial=rng.random() < 0.5)
            if rng.random() < 0.2:  # abroad
                m.update(currency="USD", amount="100.00", billing_currency="EUR",
                         billing_amount=self._amount(50, 120))
            purchases.append(m["txn"])
        elif roll < 0.24:
            m.update(type="REFUND", amount=self._amount(1, 150))
            self.others[account].append(m["txn"])
        elif roll < 0.29:
            m.update(type=rng.choice(["VERIFICATION", "BALANCE_INQUIRY"]), amount="0.00")
            self.others[account].append(m["txn"])
        elif roll < 0.44:
            m.update(type=rng.choice(["AUTHORIZATION", "AUTHORIZATION", "ADVICE"]),
                     amount=self._amount(), partial=rng.random() < 0.5)
            if rng.random() < 0.15:  # abroad
                m.update(currency="JPY", amount="15000", billing_currency="EUR",
                         billing_amount=self._amount(50, 120))
            if m["type"] != "AUTHORIZATION":
                m["partial"] = False
            self.holds[account].append(m["txn"])
        elif roll < 0.52 and hold:
            m.update(type="INCREMENTAL", amount=self._amount(1, 100), original=hold)
        elif roll < 0.62 and (hold or purchases):
            m.update(type="REVERSAL", amount=self._amount(1, 150),
                     original=hold if hold and rng.random() < 0.7 else
                     rng.choice(purchases or [hold]))
        elif roll < 0.74 and hold:
            m.update(type="CLEARING", amount=self._amount(1, 60), original=hold,
                     final=rng.choice([None, False, False, True]))
        elif roll < 0.78:
            m.update(type="CLEARING", amount=self._amount(1, 40), original=None)  # forced
        elif roll < 0.86:  # before its original, which comes later on the same account
            future = self._txn()
            kind = rng.choice(["AUTHORIZATION", "ADVICE", "PURCHASE"])
            first = rng.choice(["REVERSAL", "CLEARING"]) if kind != "PURCHASE" else "REVERSAL"
            m.update(type=first, amount=self._amount(1, 80), original=future,
                     final=rng.choice([None, False]) if first == "CLEARING" else None)
            self.later[account].append({"txn": future, "key": account, "currency": "EUR",
                                        "type": kind, "amount": self._amount(20, 200)})
            (self.holds[account] if kind != "PURCHASE" else purchases).append(future)
        elif roll < 0.9 and self.others[account]:  # names what it cannot: a mismatch
            m.update(type=rng.choice(["REVERSAL", "CLEARING"]), amount="1.00",
                     original=rng.choice(self.others[account]))
        elif roll < 0.92 and purchases:
            m.update(type="CLEARING", amount="1.00", original=rng.choice(purchases))
        elif roll < 0.94:
            m.update(type="ADVICE", amount="10.00", currency="USD")  # no billing: a mismatch
        else:
            m.update(type="PURCHASE", amount="5.00", currency="GBP")  # CURRENCY_MISMATCH
        return m

    def rest(self) -> list[dict[str, Any]]:
        """The originals announced and never sent yet."""
        out = [m for account in self.accounts for m in self.later[account]]
        for account in self.accounts:
            self.later[account] = []
        return out


def _wire(m: dict[str, Any]) -> bytes:
    fields: dict[str, Any] = {"currency": m["currency"]}
    if m.get("partial"):
        fields["partial_approval_supported"] = True
    if m.get("billing_currency"):
        fields.update(billing_amount=m["billing_amount"], billing_currency=m["billing_currency"])
    if m.get("final") is not None:
        fields["final"] = m["final"]
    return encode(lc.msg(m["txn"], m["type"], m["key"], m["amount"], m.get("original"),
                         **fields))


@pytest.mark.parametrize("seed", [1, 2])
def test_the_model_and_the_worker_decide_every_kind_alike(env, spawn_worker, seed) -> None:
    tag = f"{seed}-{uuid.uuid4().hex[:6]}"
    accounts = {f"MD-{tag}-{name}": Account(Decimal(opening), status)
                for name, (opening, status) in ACCOUNTS.items()}
    for account, state in accounts.items():
        asyncio.run(stack.seed_accounts(env.dsn, [(account, state.opening, "EUR")],
                                        status=state.status))
    book = Book(dict(accounts))
    model: dict[str, tuple[Effect, tuple[Decimal, Decimal]]] = {}
    day = RandomDay(seed, list(accounts), tag)
    stream: list[dict[str, Any]] = []

    def decide(m: dict[str, Any]) -> None:
        result, reason, approved = book.decide(m)
        ledger = book.accounts[m["key"]].opening + book.delta[m["key"]]
        figures = (ledger, ledger - book.held_by(m["key"]))  # as an inquiry reads them
        model[m["txn"]] = (book.apply(m, result, reason, approved), figures)
        stream.append(m)

    for _ in range(300):
        decide(day.message(book))
    for m in day.rest():
        decide(m)
    sent = {m["txn"]: m for m in stream}
    kinds = {m["type"] for m in stream}
    assert kinds == {"PURCHASE", "REFUND", "VERIFICATION", "BALANCE_INQUIRY", "AUTHORIZATION",
                     "ADVICE", "INCREMENTAL", "REVERSAL", "CLEARING"}
    decided = {t: e for t, (e, _) in model.items() if e.result != "MISMATCH"}
    mismatched = [t for t, (e, _) in model.items() if e.result == "MISMATCH"]
    partials = [t for t, e in decided.items() if sent[t].get("partial")
                and e.result == "APPROVED" and e.approved is not None
                and e.approved < Decimal(sent[t]["amount"])]
    assert partials, "the stream holds no partial approval"
    # A few copies of decided messages: the broker redelivers, the network retries.
    pick = random.Random(seed)
    copies = [sent[t] for t in decided if pick.random() < 0.05]

    stack.produce(env.input_topic, [(m["key"].encode(), _wire(m)) for m in stream + copies])
    spawn_worker(env)
    wait_caught_up(env.group_id, env.input_topic, env.partitions)

    want_applied = {(r, a, b, h) for e in decided.values() for r, a, b, h in e.applied}
    events = stack.events_of(stack.read_topic(env.output_topic,
                                              expect=len(decided) + len(want_applied)))
    own = {e["transaction_id"]: e for e in events
           if e["event_type"] not in ("ReversalApplied", "HoldExpired")}
    applied = {(e["transaction_id"], Decimal(e["amount_applied"]), Decimal(e["balance_delta"]),
                Decimal(e["held_delta"])) for e in events if e["event_type"] == "ReversalApplied"}
    assert set(own) == set(decided)
    for txn, effect in decided.items():
        event = own[txn]
        seen = (event["result"], event.get("decline_reason"),
                Decimal(event["amount_approved"]) if event.get("amount_approved") else None,
                Decimal(event["balance_delta"]), Decimal(event["held_delta"]),
                Decimal(event["amount_already_cleared"])
                if "amount_already_cleared" in event else None)
        want = (effect.result, effect.reason,
                effect.approved if effect.result == "APPROVED" else None,
                effect.balance_delta, effect.held_delta, effect.already_cleared)
        assert seen == want, (sent[txn], event)
        if sent[txn]["type"] == "BALANCE_INQUIRY" and effect.result == "APPROVED":
            assert (Decimal(event["ledger_balance"]), Decimal(event["available_balance"])) \
                == model[txn][1], (sent[txn], event)
    assert applied == want_applied
    dead = lc.dead_letters(env, expect=len(mismatched))
    assert sorted(reason for reason, _ in dead) == ["LIFECYCLE_MISMATCH"] * len(mismatched)
    for account in accounts:
        balance, held, _ = lc.balances(env, account)
        assert (balance, held) == (accounts[account].opening + book.delta[account],
                                   book.held_by(account)), account
    lc.verified(env)
