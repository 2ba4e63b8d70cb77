"""``payauth_decide`` (sql/payauth_decide.sql), the decision rule alone: every kind, account
state and currency against the test oracle (tests/support/oracle.py)."""

from __future__ import annotations

from decimal import Decimal

from service.domain.messages import Authorization, decode_authorization
from tests.support import stack
from tests.support.factory import auth_message, encode
from tests.support.oracle import Account, decide

ACCOUNTS = [  # id, balance, currency, status
    ("FN-A", "100.00", "EUR", "ACTIVE"),
    ("FN-B", "50.00", "EUR", "BLOCKED"),
    ("FN-C", "1000", "JPY", "ACTIVE"),
    ("FN-D", "5.00", "EUR", "ACTIVE"),
    ("FN-E", "0.00", "EUR", "ACTIVE"),
]


def _auth(txn: str, account: str, amount: str, kind: str, currency: str = "EUR"
          ) -> Authorization:
    return decode_authorization(encode(auth_message(
        txn, account_id=account, amount=amount, currency=currency, authorization_type=kind)))


def test_the_rule_decides_every_kind_as_the_reference(env: stack.Env) -> None:
    """payauth_decide on every kind, account state and currency (the lifecycle kinds: an
    ADVICE or CLEARING past the available balance and whatever the status, a REVERSAL
    always), against the oracle."""
    accounts = {a: Account(a, Decimal(b), c, s) for a, b, c, s in ACCOUNTS}
    cases = [(kind, account, currency, amount)
             for kind in ("PURCHASE", "REFUND", "AUTHORIZATION", "ADVICE", "REVERSAL",
                          "CLEARING")
             for account in [*accounts, "FN-UNKNOWN"]
             for currency in ("EUR", "JPY")
             for amount in ("1", "5000")]
    rows = stack.fetch(env.dsn, """
        SELECT payauth_decide(a.balance, a.status, a.currency, t.currency, t.kind, t.amount)
          FROM unnest($1::text[], $2::text[], $3::text[], $4::numeric[], $5::numeric[],
                      $6::text[], $7::text[]) WITH ORDINALITY
               AS t(kind, account, currency, amount, balance, status, acurrency, ord)
          CROSS JOIN LATERAL (SELECT t.balance, t.status, t.acurrency AS currency) a
         ORDER BY t.ord""",
        [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases],
        [Decimal(c[3]) for c in cases],
        [accounts[c[1]].balance if c[1] in accounts else None for c in cases],
        [accounts[c[1]].status if c[1] in accounts else None for c in cases],
        [accounts[c[1]].currency if c[1] in accounts else None for c in cases])
    for (kind, account, currency, amount), row in zip(cases, rows, strict=True):
        want = decide(_auth("R", account, amount, kind, currency) if kind != "REVERSAL" else
                      decode_authorization(encode(auth_message(
                          "R", account_id=account, amount=amount, currency=currency,
                          authorization_type=kind, original_transaction_id="H"))),
                      accounts.get(account))
        assert row[0] == (want.decline_reason or want.result), (kind, account, currency, amount)
