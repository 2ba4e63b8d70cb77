"""The bench's reading of how long each kind of process waited for a core
(``service/devtools/bench/cpu.py``), from schedstat figures given here: no /proc read.
Figures are per thread, keyed by (pid, thread id)."""

from __future__ import annotations

from service.devtools.bench.cpu import wait_per_run


def test_wait_per_run_is_the_wait_over_the_run_per_kind_and_for_the_machine() -> None:
    before = {"worker": {(10, 10): (1_000, 500)},
              "postgres": {(20, 20): (4_000, 0), (21, 21): (1_000, 1_000)},
              "other": {(30, 30): (0, 0)}}
    after = {"worker": {(10, 10): (3_000, 2_500)},
             "postgres": {(20, 20): (6_000, 1_000), (21, 21): (2_000, 1_000)},
             "other": {(30, 30): (1_000, 3_000)}}
    waited = wait_per_run(before, after)
    assert waited["worker"] == 1.0  # 2,000 ns waited over 2,000 ns run
    assert waited["postgres"] == round(1_000 / 3_000, 2)
    # The machine counts every process, "other" included, which is not reported alone.
    assert waited["machine"] == round((2_000 + 1_000 + 3_000) / (2_000 + 3_000 + 1_000), 2)
    assert "other" not in waited


def test_threads_started_ended_or_reused_between_readings_never_count_negative() -> None:
    before = {"broker": {(5, 5): (5_000, 5_000), (5, 6): (9_000, 9_000), (5, 7): (8_000, 8_000)}}
    # 6 ended (its figures go with it), 8 began (from zero), 7's id now names a new thread
    # whose figures are below the old one's (from zero too).
    after = {"broker": {(5, 5): (6_000, 5_500), (5, 7): (1_000, 500), (5, 8): (1_000, 1_500)}}
    assert wait_per_run(before, after)["broker"] == round(
        (500 + 500 + 1_500) / (1_000 + 1_000 + 1_000), 2)


def test_no_schedstat_no_figures() -> None:
    assert wait_per_run({}, {}) == {}
    assert wait_per_run({"worker": {(1, 1): (0, 0)}}, {"worker": {(1, 1): (0, 0)}}) == {}
