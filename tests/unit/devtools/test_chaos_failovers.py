"""The HA chaos report's failovers: leader changes seen by the watcher, each explained by a
fault of its engine's kind striking or settling, or counted as one nobody injected."""

from __future__ import annotations

from service.devtools.chaos.failovers import Failover, attribute, changes, render

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


def test_render_says_how_often_the_watcher_looked() -> None:
    lines = render([], started=0.0, sampled=[0.0, 1.0, 2.0, 9.5])
    assert lines[0] == "  watcher: 4 samples over 10 s, longest between two 7.5 s"
