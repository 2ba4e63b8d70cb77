"""The soak's answers from its steps (``summarize`` in ``service/devtools/bench/soak.py``): which
stretches are compared, what counts as a period dropped, and which statement was the
longest."""

from __future__ import annotations

import dataclasses

from service.devtools.bench.soak import Sample, met, summarize


def _step(minute: float, p99: float, rss: float, store: int, periods: list[str],
          charges: int, longest: float) -> Sample:
    return Sample(minute, 100.0, 6000, 0, p99 / 2, p99, rss, store, periods, charges,
                  longest, f"statement of minute {minute:g}")


def _run(p99_last: float = 40.0, rss_last: float = 100.0, store_last: int = 1000,
         charges_last: int = 500) -> list[Sample]:
    """30 one-minute steps; a period every 2 minutes, the oldest gone after 6; the
    longest statement of the run in minute 17."""
    out = []
    for m in range(1, 31):
        periods = [f"p{k}" for k in range(max(0, m // 2 - 3), m // 2 + 1)]
        late = m > 25
        out.append(_step(m, p99_last if late else 40.0, rss_last if late else 100.0,
                         store_last if late else (1000 if m > 10 else 90 * m), periods,
                         charges_last if late else (500 if m > 10 else 45 * m),
                         4.5 if m == 17 else 0.5))
    return out


def test_the_last_five_minutes_against_the_first_and_the_store_once_full() -> None:
    s = summarize(_run(p99_last=46.0, rss_last=110.0, store_last=1150),
                  retention_minutes=5, period_minutes=2)
    assert s["p99_ms_first"] == 40.0 and s["p99_ms_last"] == 46.0
    assert s["ratio_p99_last_vs_first"] == 1.15 and s["ratio_rss_last_vs_first"] == 1.1
    # full from 5 + 2 x 2 + 1 = 10 minutes: minutes 11 to 15 are the settled stretch
    assert s["store_mb_settled"] * 2**20 == 1000
    assert s["ratio_store_last_vs_settled"] == 1.15
    assert s["charges_mb_settled"] * 2**20 == 500 and s["ratio_charges_last_vs_settled"] == 1.0
    assert (s["longest_statement_s"], s["longest_statement"], s["longest_statement_minute"]) \
        == (4.5, "statement of minute 17", 17)
    assert s["periods_dropped"] == 12  # p0 … p11 seen, gone by the end
    assert met(s)


def test_growth_beyond_the_bound_or_no_purge_is_not_met() -> None:
    assert not met(summarize(_run(p99_last=50.0), retention_minutes=5, period_minutes=2))
    assert not met(summarize(_run(rss_last=130.0), retention_minutes=5, period_minutes=2))
    assert not met(summarize(_run(store_last=1300), retention_minutes=5, period_minutes=2))
    assert not met(summarize(_run(charges_last=650), retention_minutes=5, period_minutes=2))
    still = [dataclasses.replace(s, periods=["p0"]) for s in _run()]
    assert not met(summarize(still, retention_minutes=5, period_minutes=2))
