"""What a run comes to: cost (pools by the hour, APIs by the token), cost per 1M output tokens and per
1M delivered within the SLO, TTFT quantiles, SLO attainment, failures, backend shares, budget refusals;
as JSON for scripts and as a rich table for people.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from gateway.money.costs import usd_per_mtok_of
from gateway.simulate.engine import Outcome, RunResult

BUCKETS = 48  # the day in half hours, for the plots over time


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(result: RunResult) -> dict[str, Any]:
    outcomes = result.outcomes
    ok = [o for o in outcomes if o.ok]
    pools = sum(result.pool_hour_usd.values())
    api = sum(result.api_usd.values())
    total = pools + api
    output = sum(o.output_tokens for o in ok)
    within = [o for o in ok if o.within_slo]
    output_within = sum(o.output_tokens for o in within)
    ttfts = sorted(o.ttft_s for o in ok if o.ttft_s is not None)
    answered = Counter(o.backend for o in ok)
    prompt = sum(o.prompt_tokens for o in ok)
    failures = Counter(o.error or "failed" for o in outcomes if not o.ok)
    return {
        "name": result.name,
        "requests": len(outcomes),
        "ok": len(ok),
        "failures": sum(failures.values()),
        "failures_by_kind": dict(failures),
        "total_cost_usd": total,
        "pool_hours_usd": dict(result.pool_hour_usd),
        "api_usd": dict(result.api_usd),
        "attributed_cost_usd": sum(o.cost_usd for o in outcomes),
        "output_tokens": output,
        "output_tokens_within_slo": output_within,
        "usd_per_mtok_out": _per_mtok(total, output),
        "usd_per_mtok_within_slo": _per_mtok(total, output_within),
        "cache_hit_rate": sum(o.cached_tokens for o in ok) / prompt if prompt else None,  # prompt tokens
        "ttft_p50_s": quantile(ttfts, 0.50),
        "ttft_p95_s": quantile(ttfts, 0.95),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "slo_attainment": len(within) / len(outcomes) if outcomes else None,
        "share": {name: count / len(ok) for name, count in sorted(answered.items(), key=str) if name},
        "budget_exhausted_at_s": dict(result.budget_exhausted_at),
        "duration_s": result.duration_s,
    }


def over_time(result: RunResult, buckets: int = BUCKETS) -> dict[str, Any]:
    """Per slice of the run: requests answered by each backend and the TTFT p95, for the plots."""
    width = result.duration_s / buckets
    backends = sorted({o.backend for o in result.outcomes if o.ok and o.backend})
    counts = {name: [0] * buckets for name in backends}
    ttfts: list[list[float]] = [[] for _ in range(buckets)]
    for o in result.outcomes:
        index = min(buckets - 1, int(o.at / width))
        if o.ok and o.backend:
            counts[o.backend][index] += 1
            if o.ttft_s is not None:
                ttfts[index].append(o.ttft_s)
    return {
        "bucket_s": width,
        "answered": counts,
        "ttft_p95_s": [quantile(sorted(values), 0.95) for values in ttfts],
    }


def _per_mtok(usd: float, tokens: int) -> float | None:
    return usd_per_mtok_of(usd, tokens)


def to_json(results: Sequence[RunResult]) -> dict[str, Any]:
    return {"runs": [{**summarize(r), "over_time": over_time(r)} for r in results]}


def render_table(summaries: Sequence[dict[str, Any]], title: str) -> Any:
    """A rich ``Table``: one row per policy or baseline, cheapest per delivered token first."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("policy / baseline", "total $", "$/1M out", "$/1M in SLO", "TTFT p50", "p95", "p99",
                   "SLO", "failed", "share", "budget out at"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("policy / baseline", "share") else "right")
    for s in summaries:
        table.add_row(
            s["name"],
            f"{s['total_cost_usd']:,.2f}",
            _money(s["usd_per_mtok_out"]),
            _money(s["usd_per_mtok_within_slo"]),
            _seconds(s["ttft_p50_s"]),
            _seconds(s["ttft_p95_s"]),
            _seconds(s["ttft_p99_s"]),
            "-" if s["slo_attainment"] is None else f"{100 * s['slo_attainment']:.1f}%",
            str(s["failures"]),
            " ".join(f"{name} {100 * share:.0f}%" for name, share in s["share"].items() if share >= 0.005),
            " ".join(f"{cap} {_clock(at)}" for cap, at in s["budget_exhausted_at_s"].items()) or "-",
        )
    return table


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours:02d}:{rest // 60:02d}"


def outcome_fields() -> tuple[str, ...]:
    return Outcome._fields
