"""PNG plots of a simulation: cost against SLO attainment (one point per policy and baseline), and for
each policy the backend share and TTFT p95 over the simulated day. matplotlib is imported only here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def cost_vs_slo(summaries: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    # Runs that land on the same point (lowest price = all to the API) share one label.
    points: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for s in summaries:
        if s["slo_attainment"] is not None:
            key = (round(100 * s["slo_attainment"], 2), round(s["total_cost_usd"], 2))
            points.setdefault(key, []).append(s)
    for (x, y), runs in points.items():
        policy = any(r.get("kind") == "policy" for r in runs)
        ax.scatter([x], [y], s=90 if policy else 40, marker="*" if policy else "o",
                   color="tab:red" if policy else "tab:blue", zorder=3)  # fmt: skip
        label = " = ".join(r["name"] for r in runs)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel("SLO attainment (% of requests within the route's SLO)")
    ax.set_ylabel("total cost, USD (pools by the hour + API tokens)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def over_the_day(name: str, series: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    width = series["bucket_s"]
    answered: dict[str, list[int]] = series["answered"]
    hours = [(i + 0.5) * width / 3600.0 for i in range(len(series["ttft_p95_s"]))]
    totals = [sum(column) for column in zip(*answered.values(), strict=True)] if answered else []
    fig, (share_ax, ttft_ax) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, sharex=True)
    if answered:
        shares = [
            [100 * c / t if t else 0.0 for c, t in zip(counts, totals, strict=True)]
            for counts in answered.values()
        ]
        share_ax.stackplot(hours, *shares, labels=list(answered), alpha=0.85)
        share_ax.legend(loc="upper left", fontsize=8)
    share_ax.set_ylabel("share of answers, %")
    share_ax.set_ylim(0, 100)
    share_ax.set_title(f"{name}: backend share and TTFT over the simulated run", fontsize=10)
    ttft = [v if v is not None else float("nan") for v in series["ttft_p95_s"]]
    ttft_ax.plot(hours, ttft, color="tab:purple")
    ttft_ax.set_ylabel("TTFT p95, s")
    rate_ax = ttft_ax.twinx()
    rate_ax.plot(hours, [60.0 * t / width for t in totals] if totals else [], color="tab:gray", alpha=0.6)
    rate_ax.set_ylabel("answers per minute", color="tab:gray")
    ttft_ax.set_xlabel("hours into the run")
    ttft_ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(runs: Sequence[dict[str, Any]], out: Path, title: str) -> list[Path]:
    """``runs`` as in the JSON report; each policy also gets its plot over the day."""
    out.mkdir(parents=True, exist_ok=True)
    written = [cost_vs_slo(runs, out / "cost-vs-slo.png", title)]
    for run in runs:
        if run.get("kind") == "policy" or run["name"] == "oracle":
            slug = re.sub(r"[^A-Za-z0-9._-]+", "-", run["name"]).strip("-")
            written.append(over_the_day(run["name"], run["over_time"], out / f"over-the-day-{slug}.png"))
    return written
