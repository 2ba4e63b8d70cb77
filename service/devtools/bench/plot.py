"""``latency.png``: payauth's p50 and p99 against the steady rate, with Kafka's floor (the
bare relay) and the sustainable point marked. Drawn from the report's JSON, so a report
can be drawn again: ``python -m service.devtools.bench.plot results.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: a file only
import matplotlib.pyplot as plt


def draw(results: dict[str, Any], path: Path) -> None:
    points = sorted(results.get("latency_points", []), key=lambda p: p["rate_per_s"])
    floor = sorted(results.get("kafka_floor_points", []), key=lambda p: p["rate_per_s"])
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    rates = [p["rate_per_s"] for p in points]
    ax.plot(rates, [p["p99_ms"] for p in points], "o-", color="tab:red", label="payauth p99")
    ax.plot(rates, [p["p50_ms"] for p in points], "o--", color="tab:red", alpha=0.5,
            label="payauth p50")
    if floor:
        ax.plot([p["rate_per_s"] for p in floor], [p["p99_ms"] for p in floor], "s-",
                color="tab:blue", label="Kafka floor p99 (bare relay)")
        ax.plot([p["rate_per_s"] for p in floor], [p["p50_ms"] for p in floor], "s--",
                color="tab:blue", alpha=0.5, label="Kafka floor p50")
    ax.set_yscale("log")
    ax.axhline(100, color="grey", linewidth=0.8, linestyle=":")
    ax.annotate("p99 bound 100 ms", (rates[0] if rates else 0, 100), fontsize=8,
                color="grey", xytext=(0, 3), textcoords="offset points")
    sustainable = results.get("sustainable_auth_per_s")
    if sustainable:
        ax.axvline(sustainable, color="tab:green", linewidth=1)
        ax.text(sustainable, 0.03, f" sustainable {sustainable:,.0f}/s", fontsize=8,
                color="tab:green", rotation=90, va="bottom",
                transform=ax.get_xaxis_transform())
    backlog = results.get("new_auth_per_s")
    if backlog:
        ax.axvline(backlog, color="black", linewidth=0.8, linestyle="--")
        ax.text(backlog, 0.03, f" backlog {backlog:,.0f}/s", fontsize=8, rotation=90,
                va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xlabel("steady rate (authorizations/s)")
    ax.set_ylabel("produce → result event (ms)")
    machine = results.get("machine", {})
    ax.set_title(f"make bench, one worker, {machine.get('cpus', '?')} cores shared with "
                 f"Kafka, PostgreSQL and Redis ({results.get('measured_at', '')[:10]})",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    source = Path(sys.argv[1])
    draw(json.loads(source.read_text()), source.with_name("latency.png"))
