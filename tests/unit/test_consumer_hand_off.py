"""The consumer thread's hand-off of one fetch (``ConsumerThread._hand_off``): the messages go
to the asyncio side in one call, grouped by partition in offset order; a consumer error is
skipped with a warning unless fatal; a partition with too much in flight is paused. A fake
``Consumer`` stands in for librdkafka (no broker: pure logic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.adapters.kafka.consumer import ConsumerThread, OffsetTracker
from service.config import load_settings
from tests.unit.test_dispatcher import Msg

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


class _Error:
    def __init__(self, fatal: bool) -> None:
        self._fatal = fatal

    def fatal(self) -> bool:
        return self._fatal

    def str(self) -> str:
        return "broker went away"

    def code(self) -> int:
        return int(KafkaError._TRANSPORT)


@dataclass(frozen=True)
class _Msg(Msg):  # the dispatcher tests' message (topic "t"), as a fetch returns it
    failure: _Error | None = None

    def error(self) -> _Error | None:
        return self.failure


class _Consumer:
    def __init__(self) -> None:
        self.paused: list[tuple[str, int]] = []

    def pause(self, tps: list[Any]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in tps]


class _Handoff:
    def __init__(self) -> None:
        self.calls: list[dict[tuple[str, int], list[Any]]] = []

    def messages(self, arrived: dict[tuple[str, int], list[Any]]) -> None:
        self.calls.append(arrived)


def _thread(monkeypatch: pytest.MonkeyPatch, in_flight: int = 5_000
            ) -> tuple[ConsumerThread, _Handoff, _Consumer]:
    monkeypatch.setenv("PAYAUTH_MAX_IN_FLIGHT_PER_PARTITION", str(in_flight))
    handoff, consumer = _Handoff(), _Consumer()
    thread = ConsumerThread(load_settings(), handoff, OffsetTracker(), health=None,  # type: ignore[arg-type]
                            consumer_factory=lambda _conf: consumer)  # type: ignore[arg-type,return-value]
    return thread, handoff, consumer


def test_one_call_per_fetch_grouped_by_partition_in_offset_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    thread, handoff, _ = _thread(monkeypatch)
    fetch = [_Msg(0, 10), _Msg(1, 7), _Msg(0, 11), _Msg(2, 3), _Msg(1, 8)]
    thread._hand_off(fetch)  # type: ignore[arg-type]
    assert len(handoff.calls) == 1
    arrived = handoff.calls[0]
    assert {tp: [m.offset() for m in msgs] for tp, msgs in arrived.items()} == {
        ("t", 0): [10, 11], ("t", 1): [7, 8], ("t", 2): [3]}


def test_an_error_is_skipped_unless_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    thread, handoff, _ = _thread(monkeypatch)
    thread._hand_off([_Msg(0, 1), _Msg(0, -1, _Error(fatal=False)), _Msg(0, 2)])  # type: ignore[list-item]
    assert [m.offset() for m in handoff.calls[0][("t", 0)]] == [1, 2]
    thread._hand_off([_Msg(0, -1, _Error(fatal=False))])  # type: ignore[list-item]
    assert len(handoff.calls) == 1  # nothing but an error: no call at all
    with pytest.raises(KafkaException):
        thread._hand_off([_Msg(0, -1, _Error(fatal=True))])  # type: ignore[list-item]


def test_a_partition_with_too_much_in_flight_is_paused_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    thread, _, consumer = _thread(monkeypatch, in_flight=3)
    thread._hand_off([_Msg(0, 1), _Msg(0, 2), _Msg(1, 1)])  # type: ignore[list-item]
    assert consumer.paused == []
    thread._hand_off([_Msg(0, 3), _Msg(1, 2)])  # type: ignore[list-item]
    assert consumer.paused == [("t", 0)]  # 3 in flight on partition 0, 2 on partition 1
    thread._hand_off([_Msg(0, 4)])  # type: ignore[list-item]
    assert consumer.paused == [("t", 0)]  # already paused: not paused again
