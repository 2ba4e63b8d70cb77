"""The HA chaos report's failovers: leader changes seen by the watcher, each explained by a
fault of its engine's kind striking or settling, or counted as one nobody injected."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from service.devtools.chaos import failovers
from service.devtools.chaos.failovers import (
    Failover,
    attribute,
    changes,
    longest_blind_spell,
    render,
)
from service.devtools.chaos.ha_partitions import PARTITION_KINDS
from service.devtools.chaos.ha_stack import KafkaLeaderProbe

SETTLE = {"postgres primary": 5.0, "kafka leaders": 10.0, "redis master": 5.0,
          "kafka controller": 5.0}


def test_a_change_is_a_known_leader_replaced_by_another() -> None:
    samples = [(1.0, {"postgres primary": 1}), (2.0, {"postgres primary": None}),
               (3.0, {"postgres primary": 2}), (4.0, {"postgres primary": 2})]
    # nobody answering (None) is not a leader: one change, from 1 to 2
    assert changes(samples) == [(3.0, "postgres primary", 1, 2)]


def test_a_change_during_or_just_after_a_fault_of_its_kind_is_injected() -> None:
    samples = [(0.0, {"postgres primary": 1}), (12.0, {"postgres primary": 2}),
               (40.0, {"postgres primary": 1})]
    spans = [("postgres_primary_killed", 10.0, 11.0), ("postgres_switchover", 38.0, 45.0)]
    seen = attribute(samples, spans, SETTLE)
    assert [f.cause for f in seen] == ["postgres_primary_killed", "postgres_switchover"]


def test_a_change_no_fault_of_its_kind_explains_is_nobody_injected() -> None:
    samples = [(0.0, {"postgres primary": 1, "kafka leaders": (1, 2, 3)}),
               (30.0, {"postgres primary": 2, "kafka leaders": (1, 2, 3)}),
               (50.0, {"postgres primary": 2, "kafka leaders": (1, 1, 3)})]
    # a Kafka fault does not explain a PostgreSQL failover, nor one long settled a leader change
    spans = [("kafka_leader_killed", 25.0, 31.0), ("redis_master_killed", 45.0, 52.0)]
    seen = attribute(samples, spans, SETTLE)
    assert [(f.engine, f.cause) for f in seen] == [("postgres primary", None),
                                                   ("kafka leaders", None)]


def test_the_recovery_of_a_kafka_fault_is_still_that_fault() -> None:
    # the node back takes its preferred leaderships again within the settling time
    samples = [(0.0, {"kafka leaders": (1, 2, 3)}), (5.0, {"kafka leaders": (2, 2, 3)}),
               (25.0, {"kafka leaders": (1, 2, 3)})]
    seen = attribute(samples, [("kafka_leader_killed", 4.0, 20.0)], SETTLE)
    assert [f.cause for f in seen] == ["kafka_leader_killed", "kafka_leader_killed"]


def test_render_counts_per_engine_and_names_each_stray_failover() -> None:
    seen = [Failover(110.0, "redis master", 16379, 16380, "redis_master_killed"),
            Failover(150.0, "kafka leaders", (1, 2, 3), (1, 1, 3), None)]
    lines = render(seen, started=100.0)
    text = "\n".join(lines)
    assert any(line.split()[:2] == ["redis", "master"] and line.split()[2:] == ["1", "0"]
               for line in lines)
    assert "kafka leaders 1 partition(s) changed leader at +50 s" in text
    assert lines[-1].split()[-1] == "1"


def test_render_says_how_often_the_watcher_looked_and_how_long_it_was_blind() -> None:
    # a sample where an engine did not answer is no look at it: Kafka's leaders went
    # unseen from 1.0 to 9.5, although the watcher sampled at 2.0
    samples: list[tuple[float, dict[str, object]]] = [
        (0.0, {"redis master": 1, "kafka leaders": (1, 2)}),
        (1.0, {"redis master": 1, "kafka leaders": (1, 2)}),
        (2.0, {"redis master": 1, "kafka leaders": None}),
        (9.5, {"redis master": 1, "kafka leaders": (2, 2)})]
    lines = render([], started=0.0, samples=samples)
    assert lines[0] == ("  watcher: 4 samples over 10 s, longest without an answer 8.5 s "
                        "(kafka leaders)")


def test_an_engine_silent_to_the_end_is_blind_to_the_end() -> None:
    samples: list[tuple[float, dict[str, object]]] = [
        (0.0, {"redis master": 1}), (1.0, {"redis master": None}), (6.0, {"redis master": None})]
    assert longest_blind_spell(samples) == (6.0, "redis master")


class _Meta:
    def __init__(self, leaders: list[int]) -> None:
        parts = {p: SimpleNamespace(leader=leader) for p, leader in enumerate(leaders)}
        self.topics = {"t": SimpleNamespace(partitions=parts)}


class _StuckAdmin:
    """An admin client whose metadata requests went to a paused broker: each ask times
    out, for good (librdkafka keeps the connection it has)."""

    def list_topics(self, timeout: float) -> _Meta:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


class _FreshAdmin:
    def list_topics(self, timeout: float) -> _Meta:
        return _Meta([2, 3])


def test_the_leader_probe_asks_with_a_new_client_after_a_failed_ask() -> None:
    # A probe that kept the stuck client would answer nothing until the paused broker
    # woke, and miss the leaderships the pause moved.
    made = iter([_StuckAdmin(), _FreshAdmin()])
    probe = KafkaLeaderProbe(["t"], make_admin=lambda: next(made))  # type: ignore[arg-type, return-value]
    with pytest.raises(KafkaException):
        probe()
    assert probe() == (2, 3)
    assert probe.clients_replaced == 1


def test_every_partition_kind_explains_the_failovers_it_causes() -> None:
    """A partition moves the leadership of the engine it cuts: the watcher must attribute
    it, not report it as a failover nobody injected."""
    engine_of = {"postgres": "postgres primary", "redis": "redis master",
                 "kafka": "kafka leaders"}
    for kind in PARTITION_KINDS:
        if kind.startswith("worker_"):  # a worker cut off moves no engine's leadership
            assert not any(kind in causes for causes in failovers.CAUSES.values())
            continue
        assert kind in failovers.CAUSES[engine_of[kind.split("_", 1)[0]]], kind
    for kind in (k for k in PARTITION_KINDS if k.startswith("kafka_")):
        assert kind in failovers.CAUSES["kafka controller"], kind
