"""The lifecycle kinds in the message format: ``original_transaction_id`` required for a
REVERSAL, optional for a CLEARING, refused on the other kinds; part of the fingerprint
(another original is another request); both readings agree; the events' fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.domain import messages
from service.domain.dedup import StoredResult
from service.domain.errors import DeadLetterReason, InvalidMessage
from service.domain.events import hold_expired_event, result_event
from service.domain.vocabulary import Result
from tests.support.factory import auth_message, encode


def _raw(kind: str, **body: Any) -> bytes:
    return encode(auth_message("T-1", amount="12.30", authorization_type=kind, **body))


@pytest.mark.parametrize(("kind", "body", "accepted"), [
    ("REVERSAL", {"original_transaction_id": "T-0"}, True),
    ("REVERSAL", {}, False),
    ("REVERSAL", {"original_transaction_id": None}, False),
    ("CLEARING", {"original_transaction_id": "T-0"}, True),
    ("CLEARING", {}, True),
    ("CLEARING", {"original_transaction_id": None}, True),
    ("AUTHORIZATION", {}, True),
    ("ADVICE", {}, True),
    ("AUTHORIZATION", {"original_transaction_id": "T-0"}, False),
    ("ADVICE", {"original_transaction_id": "T-0"}, False),
    ("PURCHASE", {"original_transaction_id": "T-0"}, False),
    ("REFUND", {"original_transaction_id": "T-0"}, False),
    ("REVERSAL", {"original_transaction_id": "T-1"}, False),  # itself
    ("REVERSAL", {"original_transaction_id": "with space"}, False),
    ("REVERSAL", {"original_transaction_id": 7}, False),
])
def test_the_original_is_required_optional_or_refused_by_kind(kind: str, body: dict[str, Any],
                                                              accepted: bool) -> None:
    raw = _raw(kind, **body)
    if accepted:
        auth = messages.decode_authorization(raw)
        assert auth.original_transaction_id == body.get("original_transaction_id")
    else:
        with pytest.raises(InvalidMessage) as refused:
            messages.decode_authorization(raw)
        assert refused.value.reason is DeadLetterReason.SCHEMA_VIOLATION
    key = messages.redelivery_key(raw)
    if accepted:  # the cheap reading agrees with the strict one on the fingerprint
        assert key is not None
        assert key.fingerprint == messages.decode_authorization(raw).fingerprint


def test_another_original_is_another_request_and_purchases_keep_their_fingerprint() -> None:
    one = messages.decode_authorization(_raw("REVERSAL", original_transaction_id="A"))
    other = messages.decode_authorization(_raw("REVERSAL", original_transaction_id="B"))
    assert one.fingerprint != other.fingerprint
    purchase = messages.decode_authorization(_raw("PURCHASE"))
    assert purchase.fingerprint == messages.fingerprint_of(
        purchase.account_id, "12.30", "EUR", "PURCHASE")


def _stored(kind: str, **fields: Any) -> StoredResult:
    return StoredResult(transaction_id="T-1", fingerprint="f", result=Result.APPROVED,
                        decline_reason=None, account_id="ACC", amount_text="12.30",
                        currency="EUR", authorization_type=kind, correlation_id="c",
                        processed_at=datetime(2026, 4, 7, 14, 32, 15, tzinfo=UTC),
                        published=False, **fields)


COMMON = {"event_type", "event_id", "transaction_id", "account_id", "currency", "result",
          "correlation_id", "processed_at"}


def test_the_lifecycle_events_carry_the_contracts_fields() -> None:
    reversed_ = result_event(_stored("REVERSAL", original_transaction_id="H",
                                     amount_applied_text="10.00"))
    assert reversed_.keys() >= COMMON
    assert (reversed_["event_type"], reversed_["original_transaction_id"], reversed_["amount"],
            reversed_["amount_applied"], reversed_["result"]) == \
        ("PaymentReversed", "H", "12.30", "10.00", "APPROVED")
    cleared = result_event(_stored("CLEARING", original_transaction_id="H", forced=False,
                                   amount_applied_text="5.00"))
    assert cleared.keys() >= COMMON
    assert (cleared["event_type"], cleared["original_transaction_id"], cleared["forced"]) == \
        ("PaymentCleared", "H", False)
    forced = result_event(_stored("CLEARING", original_transaction_id="NOPE", forced=True,
                                  amount_applied_text="0.00"))
    assert (forced["original_transaction_id"], forced["forced"]) == (None, True)
    held = result_event(_stored("AUTHORIZATION"))
    assert (held["event_type"], held["authorization_type"]) == ("PaymentAuthorized",
                                                                "AUTHORIZATION")
    expired = hold_expired_event("H", "ACC", "EUR", "10.00", "c",
                                 datetime(2026, 4, 14, tzinfo=UTC))
    assert expired.keys() >= COMMON
    assert (expired["event_type"], expired["transaction_id"], expired["amount_released"]) == \
        ("HoldExpired", "H", "10.00")
    # stable per hold, and not the hold's own PaymentAuthorized event_id
    assert expired["event_id"] == hold_expired_event("H", "ACC", "EUR", "10.00", None,
                                                     datetime.now(UTC))["event_id"]
    assert expired["event_id"] != messages.event_id_for("H")
