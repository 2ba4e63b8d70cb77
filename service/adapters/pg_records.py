"""The store's rows as ``StoredResult``s: a dedup record, a ledger entry whose dedup record was
purged, a lifecycle message, and what ``payauth_authorize`` (sql/payauth_authorize.sql)
answered for a batch's message."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from service.domain.dedup import AppliedReversal, StoredResult
from service.domain.messages import Authorization, fingerprint_of
from service.domain.money import format_amount, format_stored
from service.domain.vocabulary import AuthorizationType, DeclineReason, Result


def _applied(text: str | None, currency: str) -> str | None:
    return None if text is None else format_stored(text, currency)


def _reversals(ids: list[str] | None, amounts: list[str] | None,
               correlations: list[str | None] | None, currency: str
               ) -> tuple[AppliedReversal, ...]:
    """The orphan reversals a decision applied, as the store listed them (three aligned
    arrays, NULL for none)."""
    if not ids or amounts is None or correlations is None:
        return ()
    return tuple(AppliedReversal(txn, format_stored(amount, currency), correlation)
                 for txn, amount, correlation in zip(ids, amounts, correlations, strict=True))


def decided_result(a: Authorization, row: Any, processed_at: datetime, batch_id: uuid.UUID,
                   partition: int) -> StoredResult:
    """A message of a batch as ``payauth_authorize`` answered for it: a decision, or why it
    named an original it cannot (``mismatch``: nothing stored). Its amounts in the account's
    currency are formatted in that currency's minor unit. (Once per lifecycle message on the
    hot path: each field read once, and only what a row has is formatted or set.)"""
    mismatch = row["mismatch"]
    currency = row["account_currency"] or a.currency
    reason = row["decline_reason"]
    applied, balance_delta, held_delta = (row["amount_applied"], row["balance_delta"],
                                          row["held_delta"])
    applied_ids = row["applied_ids"]
    record = StoredResult(
        a.transaction_id, a.fingerprint,
        Result.DECLINED if row["result"] == "DECLINED" else Result.APPROVED,
        DeclineReason(reason) if reason is not None else None,
        a.account_id, a.amount_text, a.currency, a.authorization_type, a.correlation_id,
        processed_at, False, batch_id, partition, a.message_id,
        original_transaction_id=a.original_transaction_id,
        amount_applied_text=None if applied is None else format_stored(applied, currency),
        forced=row["forced"],
        orphan=row["orphan"],
        mismatch=mismatch,
        balance_delta_text=(None if balance_delta is None
                            else format_stored(balance_delta, currency)),
        held_delta_text=None if held_delta is None else format_stored(held_delta, currency),
        reversals_applied=() if not applied_ids else _reversals(
            applied_ids, row["applied_amounts"], row["applied_correlations"], currency),
        final=a.final if a.authorization_type == AuthorizationType.CLEARING else None,
    )
    if mismatch is None:
        with_day(record, a, row)
    return record


def with_day(record: StoredResult, a: Authorization, row: Any) -> StoredResult:
    """An issuer's day's fields of a decision (``payauth_authorize``'s row): what was approved
    (when not the amount as sent), a partial approval, the account's currency (when not the
    message's), the conversion as sent, an inquiry's figures, what clearings before a hold
    released of it; and what names a card control's decline (the card's status, the
    limit). (A field the row does not have keeps the record's default.)"""
    account_currency = row["account_currency"] or a.currency
    converted = account_currency != a.currency
    if converted:
        record.account_currency = account_currency
    approved = row["approved"]
    if approved is not None and record.result is Result.APPROVED \
            and (converted or approved != a.amount_text):
        text = format_stored(approved, account_currency)
        if text != a.amount_text or converted:
            record.amount_approved_text = text
    if row["partial"]:
        record.partial = True
    if a.billing_currency is not None:
        record.billing_amount_text = a.billing_amount_text
        record.billing_currency = a.billing_currency
    for column, field in _FIGURES:
        text = row[column]
        if text is not None:
            setattr(record, field, format_stored(text, account_currency))
    record.card_status = row["card_status"]
    record.limit_id = row["limit_id"]
    return record


# The figures of a decision in the account's currency that few rows have (an inquiry's
# balances, what clearings before a hold released), and the record's field for each.
_FIGURES = (("ledger_balance", "ledger_balance_text"),
            ("available_balance", "available_balance_text"),
            ("already_cleared", "already_cleared_text"))


def stored_from_row(row: Any) -> StoredResult:
    currency = row["account_currency"] or row["currency"]
    kind = row["authorization_type"]
    approved = row["approved_text"]
    record = StoredResult(
        transaction_id=row["txn_id"],
        fingerprint=row["fingerprint"],
        result=Result(row["result"]),
        decline_reason=DeclineReason(row["decline_reason"]) if row["decline_reason"] else None,
        account_id=row["account_id"],
        amount_text=format_amount(Decimal(row["amount_text"]), row["currency"]),
        currency=row["currency"],
        authorization_type=kind,
        correlation_id=row["correlation_id"],
        processed_at=row["processed_at"],
        published=row["published"],
        source_partition=row["source_partition"],
        message_id=row["message_id"],
        original_transaction_id=row["original_txn_id"],
        amount_applied_text=_applied(row["applied_text"], currency),
        forced=row["forced"],
        orphan=row["orphan"],
        balance_delta_text=_applied(row["balance_delta"], currency),
        held_delta_text=_applied(row["held_delta"], currency),
        reversals_applied=_reversals(row["applied_ids"], row["applied_amounts"],
                                     row["applied_correlations"], currency),
        account_currency=currency if currency != row["currency"] else None,
        billing_currency=row["billing_currency"],
        billing_amount_text=_applied(row["billing_text"], row["billing_currency"])
        if row["billing_currency"] else None,
        final=row["final"] if kind == AuthorizationType.CLEARING else None,
        ledger_balance_text=_applied(row["ledger_text"], currency),
        available_balance_text=_applied(row["available_text"], currency),
        already_cleared_text=_applied(row["cleared_text"], currency),
        card_status=row["card_status"],
        limit_id=row["limit_id"],
    )
    if approved is not None and record.result is Result.APPROVED:
        text = format_amount(Decimal(approved), currency)
        if text != record.amount_text or record.account_currency is not None:
            record.amount_approved_text = text
        record.partial = bool(row["partial"])
    return record


def stored_from_ledger(row: Any) -> StoredResult:
    # The dedup record is gone but the ledger still says what was approved, which is all the
    # fingerprint covers (or, when the entry does not say what was asked, as for a partial
    # approval or a conversion, it keeps the request's fingerprint); the event was published
    # long ago (the record outlived delivery).
    currency = row["currency"]
    amount_text = format_amount(Decimal(row["amount_text"]), currency)
    auth_type = row["authorization_type"]
    return StoredResult(
        transaction_id=row["txn_id"],
        fingerprint=row["request_fingerprint"]
        or fingerprint_of(row["account_id"], amount_text, currency, auth_type),
        result=Result.APPROVED,
        decline_reason=None,
        account_id=row["account_id"],
        amount_text=amount_text,
        currency=currency,
        authorization_type=auth_type,
        correlation_id=None,
        processed_at=row["processed_at"],
        published=True,
    )
