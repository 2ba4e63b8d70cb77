"""The decision rules' Python model (``tests/support/oracle.py``), the oracle the SQL
function payauth_decide is held to in tests/integration/sql/test_payauth_decide.py: the
model itself must say what the contract says."""

from __future__ import annotations

from decimal import Decimal

from service.domain.messages import Authorization, decode_authorization
from service.domain.vocabulary import DeclineReason, Result
from tests.support.factory import auth_message, encode
from tests.support.oracle import Account, decide, decide_in_order


def auth(txn: str = "T1", **kw: object) -> Authorization:
    return decode_authorization(encode(auth_message(txn, **kw)))  # type: ignore[arg-type]


def account(balance: str = "100.00", currency: str = "EUR", status: str = "ACTIVE") -> Account:
    return Account("ACC-1", Decimal(balance), currency, status)


def test_purchase_within_balance_is_approved_and_debits() -> None:
    d = decide(auth(amount="40.00"), account())
    assert (d.result, d.decline_reason, d.delta) == (Result.APPROVED, None, Decimal("-40.00"))


def test_exact_balance_is_enough() -> None:
    assert decide(auth(amount="100.00"), account()).result is Result.APPROVED


def test_declines() -> None:
    assert decide(auth(amount="100.01"), account()).decline_reason is \
        DeclineReason.INSUFFICIENT_FUNDS
    assert decide(auth(), None).decline_reason is DeclineReason.UNKNOWN_ACCOUNT
    assert decide(auth(), account(currency="USD")).decline_reason is \
        DeclineReason.CURRENCY_MISMATCH
    assert decide(auth(), account(status="BLOCKED")).decline_reason is \
        DeclineReason.ACCOUNT_BLOCKED
    assert decide(auth(amount="1000"), account()).delta == 0


def test_refund_credits_even_beyond_the_balance() -> None:
    d = decide(auth(amount="500.00", authorization_type="REFUND"), account("0"))
    assert (d.result, d.delta) == (Result.APPROVED, Decimal("500.00"))
    assert decide(auth(authorization_type="REFUND"), account(status="CLOSED")).result is \
        Result.DECLINED


def test_batch_decisions_see_the_balance_left_by_earlier_ones() -> None:
    a = account("100.00")
    decisions = decide_in_order(
        [auth("T1", amount="60.00"), auth("T2", amount="60.00"),
         auth("T3", amount="50.00", authorization_type="REFUND"), auth("T4", amount="60.00")],
        {"ACC-1": a},
    )
    assert [d.result for d in decisions] == [Result.APPROVED, Result.DECLINED, Result.APPROVED,
                                             Result.APPROVED]
    assert sum(d.delta for d in decisions) == Decimal("-70.00")
