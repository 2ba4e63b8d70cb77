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


def _message(kind: str, account: str, amount: str, currency: str, partial: bool,
             billing: bool) -> Authorization:
    fields: dict[str, object] = {}
    if kind in ("REVERSAL", "INCREMENTAL"):
        fields["original_transaction_id"] = "H"
    if partial and kind in ("PURCHASE", "AUTHORIZATION"):
        fields["partial_approval_supported"] = True
    if billing:
        fields["billing_amount"] = "3.00" if kind not in ("VERIFICATION", "BALANCE_INQUIRY") \
            else "0.00"
        fields["billing_currency"] = "EUR"
    zero = kind in ("VERIFICATION", "BALANCE_INQUIRY")
    return decode_authorization(encode(auth_message(
        "R", account_id=account, amount="0" if zero else amount, currency=currency,
        authorization_type=kind, **fields)))


def test_the_rule_decides_every_kind_as_the_reference(env: stack.Env) -> None:
    """payauth_decide on every kind, account state and currency, with and without a
    conversion and a partial approval's acceptance, and an increment's hold active or not,
    against the oracle: the outcome and what it approves (payauth_approved)."""
    accounts = {a: Account(a, Decimal(b), c, s) for a, b, c, s in ACCOUNTS}
    cases = [(kind, account, currency, amount, partial, billing, hold)
             for kind in ("PURCHASE", "REFUND", "AUTHORIZATION", "ADVICE", "REVERSAL",
                          "CLEARING", "VERIFICATION", "BALANCE_INQUIRY", "INCREMENTAL")
             for account in [*accounts, "FN-UNKNOWN"]
             for currency in ("EUR", "JPY")
             for amount in ("1", "5000")
             for partial in (False, True)
             for billing in (False, True)
             for hold in ((None, "ACTIVE", "CLEARED") if kind == "INCREMENTAL" else (None,))]
    messages = [_message(k, a, m, c, p, b) for k, a, c, m, p, b, _h in cases]
    rows = stack.fetch(env.dsn, """
        SELECT d.outcome, payauth_approved(d.outcome, d.amt, d.balance)::text AS approved
          FROM (SELECT payauth_decide(t.balance, t.status, t.kind, x.amt, t.hold, t.partial,
                                      NULL, NULL, NULL)
                       AS outcome, x.amt, t.balance, t.ord
                  FROM unnest($1::text[], $2::text[], $3::numeric[], $4::text[],
                              $5::numeric[], $6::text[], $7::text[], $8::text[],
                              $9::boolean[], $10::numeric[])
                       WITH ORDINALITY AS t(kind, currency, amount, bcur, balance, status,
                                            acurrency, hold, partial, bamt, ord)
                 CROSS JOIN LATERAL (SELECT payauth_account_amount(
                                         t.acurrency, t.currency, t.amount, t.bcur, t.bamt)
                                         AS amt) x) d
         ORDER BY d.ord""",
        [m.authorization_type.value for m in messages], [m.currency for m in messages],
        [m.amount for m in messages], [m.billing_currency for m in messages],
        [accounts[c[1]].balance if c[1] in accounts else None for c in cases],
        [accounts[c[1]].status if c[1] in accounts else None for c in cases],
        [accounts[c[1]].currency if c[1] in accounts else None for c in cases],
        [c[6] for c in cases], [m.partial_ok for m in messages],
        [Decimal(m.billing_amount_text) if m.billing_amount_text else None for m in messages])
    seen = set()
    for case, message, row in zip(cases, messages, rows, strict=True):
        want = decide(message, accounts.get(case[1]), case[6])
        outcome = want.decline_reason or ("PARTIAL" if want.partial else "APPROVED")
        assert row["outcome"] == outcome, case
        if want.approved is not None and message.authorization_type.value != "REVERSAL":
            # (An inquiry with no amount in the account's currency approves none.)
            assert Decimal(row["approved"] or 0) == want.approved, case
        seen.add(row["outcome"])
    assert {"APPROVED", "PARTIAL", "UNKNOWN_ACCOUNT", "ACCOUNT_BLOCKED", "CURRENCY_MISMATCH",
            "HOLD_NOT_ACTIVE", "INSUFFICIENT_FUNDS"} <= seen
