"""Values other systems keep: pinned literally, so that a change that would break them (a new
event namespace, a reordered fingerprint, a renamed event field) fails here, not downstream.

Downstream consumers dedup on ``event_id``; a changed namespace would make every republished
event look new to them. Stored dedup records keep fingerprints; a changed fingerprint would
turn every redelivery of a decided transaction into a conflict."""

from __future__ import annotations

from datetime import UTC, datetime

from service.domain.dedup import StoredResult
from service.domain.events import encode_event, result_event
from service.domain.messages import decode_authorization, event_id_for, fingerprint_of
from service.domain.vocabulary import DeclineReason, Result
from tests.support.factory import auth_message, encode

CONTRACT_TXN = "TXN-VISA-8847291"


def test_event_id_of_the_contract_example() -> None:
    assert event_id_for(CONTRACT_TXN) == "7cfc1103-006d-563a-a1a0-68cf3ef1c7a4"


def test_fingerprint_of_the_contract_example() -> None:
    expected = "88975d7db62baf243bf789b397f4a65ef26e675ac7bd36b3a779dc04e7f8f1f3"
    assert fingerprint_of("ACC-44821", "125.50", "EUR", "PURCHASE") == expected
    message = auth_message(CONTRACT_TXN, account_id="ACC-44821", amount="125.5")
    assert decode_authorization(encode(message)).fingerprint == expected


def test_event_bytes_of_a_decline() -> None:
    record = StoredResult(
        CONTRACT_TXN, "fp", Result.DECLINED, DeclineReason.INSUFFICIENT_FUNDS, "ACC-44821",
        "125.50", "EUR", "PURCHASE", "txn-VISA-2026-8847291",
        datetime(2026, 4, 7, 14, 32, 15, 120000, tzinfo=UTC), False)
    assert encode_event(result_event(record)) == (
        b'{"event_type":"PaymentDeclined","event_id":"7cfc1103-006d-563a-a1a0-68cf3ef1c7a4",'
        b'"transaction_id":"TXN-VISA-8847291","account_id":"ACC-44821","amount":"125.50",'
        b'"currency":"EUR","authorization_type":"PURCHASE","result":"DECLINED",'
        b'"decline_reason":"INSUFFICIENT_FUNDS","balance_delta":"0.00","held_delta":"0.00",'
        b'"amount_approved":null,"partial":false,"correlation_id":"txn-VISA-2026-8847291",'
        b'"processed_at":"2026-04-07T14:32:15.120Z"}')


def test_event_id_is_the_uuid5_of_the_transaction_id() -> None:
    import random
    import uuid

    from service.domain.messages import EVENT_NAMESPACE

    rng = random.Random(5)
    names = ["", "X", "TXN-VISA-8847291", "é-ü-ß", "\U0001f4b3" * 3, "a" * 128] + [
        "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(1, 40)))
        for _ in range(500)]
    for name in names:
        assert event_id_for(name) == str(uuid.uuid5(EVENT_NAMESPACE, name)), name
