"""A batch's classification (``service/domain/dedup.py``): new, duplicate of a stored
result, conflict, and the first occurrence within one batch deciding."""

from __future__ import annotations

from datetime import UTC, datetime

from service.domain.dedup import Kind, StoredResult, classify
from service.domain.messages import Authorization, decode_authorization
from service.domain.vocabulary import Result
from tests.support.factory import auth_message, encode


def auth(txn: str = "T1", **kw: object) -> Authorization:
    return decode_authorization(encode(auth_message(txn, **kw)))  # type: ignore[arg-type]


def stored(a: Authorization, result: Result = Result.APPROVED) -> StoredResult:
    return StoredResult(a.transaction_id, a.fingerprint, result, None, a.account_id,
                        a.amount_text, a.currency, a.authorization_type.value, None,
                        datetime.now(UTC), True)


def test_classify_stored_duplicate_and_conflict() -> None:
    first = auth("T1", amount="10.00")
    same = auth("T1", amount="10.00", message_id="another")
    other = auth("T1", amount="11.00")
    out = classify([same, other, auth("T2")], {"T1": stored(first)})
    assert [c.kind for c in out] == [Kind.DUPLICATE, Kind.CONFLICT, Kind.NEW]
    assert out[0].previous is not None and out[0].previous.transaction_id == "T1"


def test_classify_within_one_batch_first_occurrence_decides() -> None:
    a, b, c = auth("T1", amount="1.00"), auth("T1", amount="1.00"), auth("T1", amount="2.00")
    out = classify([a, b, c], {})
    assert [x.kind for x in out] == [Kind.NEW, Kind.DUPLICATE, Kind.CONFLICT]
    assert out[1].first_in_batch is a
