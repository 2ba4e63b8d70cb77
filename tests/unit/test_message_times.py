"""The message times the authorize call sends (``postgres._message_times``): each message's
own instant, written once per distinct time of a batch, never another message's."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

from service.adapters.postgres import _message_times
from tests.support.factory import authorization

DECIDED = datetime(2026, 12, 7, 0, 0, 5, tzinfo=UTC)


def _at(sent: datetime | None, n: int) -> object:
    return replace(authorization(f"T-{n}", "ACC-1", "1.00"), sent_at=sent)


def test_each_message_gets_its_own_instant_and_a_naive_one_is_utc() -> None:
    late = datetime(2026, 12, 6, 23, 59, 59, tzinfo=UTC)
    naive = datetime(2026, 12, 6, 23, 59, 59)
    madrid = datetime(2026, 12, 7, 0, 59, 59, tzinfo=timezone(timedelta(hours=1)))
    batch = [_at(late, 1), _at(None, 2), _at(naive, 3), _at(late + timedelta(seconds=1), 4),
             _at(madrid, 5), _at(late, 6)]
    texts = _message_times(batch, DECIDED)  # type: ignore[arg-type]
    instants = [datetime.fromisoformat(t) for t in texts]
    assert instants == [late, DECIDED, late, late + timedelta(seconds=1), late, late]
    assert all(i.tzinfo is not None for i in instants)  # never left to the session's zone


def test_a_time_shared_by_many_messages_is_written_alike() -> None:
    sent = datetime(2026, 4, 7, 14, 32, 15, tzinfo=UTC)
    batch = [_at(sent, n) for n in range(50)]
    texts = _message_times(batch, DECIDED)  # type: ignore[arg-type]
    assert texts == ["2026-04-07T14:32:15+00:00"] * 50
