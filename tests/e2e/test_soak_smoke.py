"""``make soak`` shortened to keep it working (two minutes and a half, a window of a minute,
steps of 30 s): the worker purges whole periods under the steady load, nothing sent goes
missing, verify holds, and every step is kept. No time is asserted."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from service.config import load_settings
from service.devtools.bench import soak
from service.devtools.bench.run import FULL, Bench
from tests.support import stack


def test_a_short_soak_purges_whole_periods_and_verify_holds(live_stack: None, tmp_path: Path
                                                            ) -> None:
    settings = load_settings(database_url=stack.ENDPOINTS.pg_admin_dsn,
                             redis_url=stack.ENDPOINTS.redis_url,
                             kafka_bootstrap_servers=stack.ENDPOINTS.kafka["bootstrap.servers"])
    settings = settings.model_copy(update={"redis_url": SecretStr(
        settings.redis_url.get_secret_value())})
    bench = Bench(settings, FULL, tmp_path / "results.json", "INFO", phases=frozenset())
    try:
        result = soak.soak(bench, 2.5, 1.0, 30)
    finally:
        bench.cleanup()
    summary, steps = result["summary"], result["steps"]
    assert summary["verify_ok"] is True and summary["worker_exit"] == 0
    assert summary["purges_failed"] == 0 and summary["missing"] == 0
    assert summary["periods_deferred"] == 0  # (a vacuum of the period under way held none)
    assert summary["periods_dropped"] >= 1, steps
    assert summary["period_seconds"] == 60
    assert len(steps) >= 4 and all(s["samples"] > 0 and s["store_bytes"] > 0 for s in steps)
    # (Each purchase is counted in two limits: their charges fill megabytes in a step.)
    assert max(s["charges_bytes"] for s in steps) > 2**20, steps
    # (Sampled each second under a steady load: the worker's statements among them.)
    assert summary["longest_statement"] and summary["longest_statement_s"] >= 0
    assert summary["messages"] == sum(s["samples"] for s in steps)
    assert not any(tmp_path.glob("logs-*/*.log"))  # read, then removed
