"""Result events stay the events of the contract: the event id is the UUIDv5 of the
transaction id, the decision time UTC to the millisecond (cached per decision time on the hot
path: a republished event must stay byte-identical)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta, timezone

from service.domain.events import event_time
from service.domain.messages import EVENT_NAMESPACE, event_id_for


def test_event_ids_are_the_uuid5_of_the_transaction_id() -> None:
    rng = random.Random(7)
    alphabet = "ABCXYZ0123456789-_.:/ éü€中"
    names = ["", "TXN-VISA-8847291", "x" * 128] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 64))) for _ in range(2000)]
    for name in names:
        assert event_id_for(name) == str(uuid.uuid5(EVENT_NAMESPACE, name)), name


def test_event_time_is_utc_to_the_millisecond_for_each_moment() -> None:
    moment = datetime(2026, 4, 7, 14, 32, 15, 120999, tzinfo=UTC)
    assert event_time(moment) == "2026-04-07T14:32:15.120Z"
    # the same instant in another zone, and the next millisecond: each its own answer
    assert event_time(moment.astimezone(timezone(timedelta(hours=2)))) == \
        "2026-04-07T14:32:15.120Z"
    assert event_time(moment + timedelta(microseconds=1)) == "2026-04-07T14:32:15.121Z"
