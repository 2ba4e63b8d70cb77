"""An event's decision time: UTC to the millisecond, the same text for the same instant
(cached per decision time on the hot path: a republished event must stay byte-identical)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from service.domain.events import event_time


def test_event_time_is_utc_to_the_millisecond_for_each_moment() -> None:
    moment = datetime(2026, 4, 7, 14, 32, 15, 120999, tzinfo=UTC)
    assert event_time(moment) == "2026-04-07T14:32:15.120Z"
    # the same instant in another zone, and the next millisecond: each its own answer
    assert event_time(moment.astimezone(timezone(timedelta(hours=2)))) == \
        "2026-04-07T14:32:15.120Z"
    assert event_time(moment + timedelta(microseconds=1)) == "2026-04-07T14:32:15.121Z"
