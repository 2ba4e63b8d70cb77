"""A Python model of the decision rules, for tests only: production decides in one place, the
SQL function ``payauth_decide`` (``sql/payauth_decide.sql``), called by ``payauth_authorize``.
``tests/integration/sql/test_payauth_decide.py`` and ``test_payauth_authorize.py`` beside it
hold the function to this model, rule by rule and on random batches; a disagreement means
one of the two is wrong, and the test says which batch shows it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from service.domain.messages import Authorization
from service.domain.vocabulary import AccountStatus, AuthorizationType, DeclineReason, Result


@dataclass(frozen=True, slots=True)
class Account:
    account_id: str
    balance: Decimal
    currency: str
    status: str  # an AccountStatus value


@dataclass(frozen=True, slots=True)
class Decision:
    result: Result
    decline_reason: DeclineReason | None
    delta: Decimal  # signed change to the balance; 0 for a decline
    approved: Decimal | None = None  # in the account's currency; None for a decline
    partial: bool = False  # approved for the available balance, less than asked


def account_amount(auth: Authorization, account: Account) -> Decimal | None:
    """What the message moves in its account's currency: its amount, or the network's
    billing amount, or nothing (the contract's "Conversion")."""
    if account.currency == auth.currency:
        return auth.amount
    if auth.billing_currency == account.currency and auth.billing_amount_text is not None:
        return Decimal(auth.billing_amount_text)
    return None


def decide(auth: Authorization, account: Account | None,
           hold_state: str | None = None) -> Decision:
    """Approve or decline one authorization against the account as it stands now (its
    balance: the available one), the first reason that applies in the contract's order.
    ``hold_state``: an INCREMENTAL's hold, as its decision reads it (None: no approved hold
    of the account). The lifecycle kinds' deltas are not the ledger's (a hold moves the
    available balance only; what a REVERSAL or CLEARING applies depends on its original):
    this model says only whether they are approved, and for how much."""
    kind = auth.authorization_type
    if kind is AuthorizationType.REVERSAL:
        return Decision(Result.APPROVED, None, Decimal(0), auth.amount)
    if account is None:
        return Decision(Result.DECLINED, DeclineReason.UNKNOWN_ACCOUNT, Decimal(0))
    amount = account_amount(auth, account)
    if kind in (AuthorizationType.ADVICE, AuthorizationType.CLEARING) and amount is not None:
        return Decision(Result.APPROVED, None, -amount, amount)
    if account.status != AccountStatus.ACTIVE:
        return Decision(Result.DECLINED, DeclineReason.ACCOUNT_BLOCKED, Decimal(0))
    if kind is AuthorizationType.BALANCE_INQUIRY:
        return Decision(Result.APPROVED, None, Decimal(0), amount or Decimal(0))
    if amount is None:
        return Decision(Result.DECLINED, DeclineReason.CURRENCY_MISMATCH, Decimal(0))
    if kind is AuthorizationType.INCREMENTAL and hold_state != "ACTIVE":
        return Decision(Result.DECLINED, DeclineReason.HOLD_NOT_ACTIVE, Decimal(0))
    if kind is AuthorizationType.REFUND:
        return Decision(Result.APPROVED, None, amount, amount)
    if kind is AuthorizationType.VERIFICATION:
        return Decision(Result.APPROVED, None, Decimal(0), amount)
    if account.balance >= amount:
        return Decision(Result.APPROVED, None, -amount, amount)
    if auth.partial_ok and kind in (AuthorizationType.PURCHASE,
                                    AuthorizationType.AUTHORIZATION) and account.balance > 0:
        return Decision(Result.APPROVED, None, -account.balance, account.balance, True)
    return Decision(Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS, Decimal(0))


def decide_in_order(
    new: Sequence[Authorization], accounts: Mapping[str, Account]
) -> list[Decision]:
    """Decide new authorizations in offset order, each seeing the balance the ones before it
    left (one account's debits in a batch cannot overdraw it together)."""
    return [decision for _, decision in decide_in_order_with_inputs(new, accounts)]


def decide_in_order_with_inputs(
    new: Sequence[Authorization], accounts: Mapping[str, Account]
) -> list[tuple[Account | None, Decision]]:
    """As ``decide_in_order``, with the account each decision saw (its inputs)."""
    current = dict(accounts)
    out = []
    for auth in new:
        account = current.get(auth.account_id)
        decision = decide(auth, account)
        if auth.authorization_type not in (AuthorizationType.PURCHASE,
                                           AuthorizationType.REFUND):
            decision = Decision(decision.result, decision.decline_reason, Decimal(0),
                                decision.approved)
        if account is not None and decision.delta:
            current[auth.account_id] = Account(
                account.account_id, account.balance + decision.delta, account.currency,
                account.status,
            )
        out.append((account, decision))
    return out
