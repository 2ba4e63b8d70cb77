"""A batch's log lines: one for its decisions, one summing up its duplicates, one per problem,
each renderable as the worker renders it (orjson, which refuses a dictionary key that is a
str subclass such as a vocabulary member)."""

from __future__ import annotations

import json

from structlog.testing import capture_logs

from service.core.plan import BatchPlan, Conflict, Decided, Duplicate, Invalid
from service.core.reporting import account
from service.domain.errors import DeadLetterReason
from service.domain.vocabulary import DuplicateCause, DuplicateLayer
from service.logs import _dumps
from tests.support.factory import auth_message, encode
from tests.unit.test_pipeline import Msg
from tests.unit.test_plan import stored


def test_a_batch_logs_its_decisions_duplicates_and_problems_as_json_lines() -> None:
    approved = stored(encode(auth_message("T-1")), published=False)
    with capture_logs() as captured:
        account(BatchPlan([
            Decided(Msg(b"", 1), approved, "m-1"),
            Duplicate(Msg(b"", 2), DuplicateLayer.REDIS, "T-0", DuplicateCause.REDELIVERY),
            Duplicate(Msg(b"", 3), DuplicateLayer.POSTGRES, "T-9", DuplicateCause.REPLAY),
            Conflict(Msg(b"", 4), "T-1", "m-4", (("amount", "1.00", "2.00"),), approved),
            Invalid(Msg(b"", 5), DeadLetterReason.INVALID_JSON, "not JSON"),
        ]))
    lines = {line["event"]: line for line in (json.loads(_dumps(e)) for e in captured)}
    assert lines["decided"]["decisions"] == [
        {"partition": 0, "offset": 1, "transaction_id": "T-1", "outcome": "approved"}]
    assert lines["duplicates"]["by_layer"] == {"redis": 1, "postgres": 1}
    assert lines["duplicates"]["by_cause"] == {"redelivery": 1, "replay": 1}
    assert lines["idempotency_key_conflict"]["outcome"] == "conflict"
    assert lines["dead_lettered"]["reason"] == "INVALID_JSON"
    assert lines["dead_lettered"]["outcome"] == "invalid"
