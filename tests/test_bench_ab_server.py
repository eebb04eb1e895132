"""bench.ab_server's summary: medians per checkout, and the median of each round's own ratio."""

from __future__ import annotations

from typing import Any

from bench.ab_server import METRICS, summary


def run(cpu: float, **overrides: float) -> dict[str, Any]:
    return {**dict.fromkeys(METRICS[1:], 1.0), "cpu_us_per_req": cpu, **overrides}


def test_the_summary_pairs_the_rounds() -> None:
    # Round 2 is a noisy spell for both: the medians move with it, each round's ratio does not.
    main = [run(400.0), run(800.0), run(420.0)]
    branch = [run(300.0), run(600.0), run(340.0)]
    result = {
        "rounds": 3,
        "runs": {"main": main, "branch": branch},
        "medians": {
            "main": {"idle_rss_mb": 50.0, **dict.fromkeys(METRICS[1:], 1.0), "cpu_us_per_req": 420.0},
            "branch": {"idle_rss_mb": 49.0, **dict.fromkeys(METRICS[1:], 1.0), "cpu_us_per_req": 340.0},
        },
        "load_average": [1.0, 2.0],
    }
    lines = {line.split()[0]: line.split() for line in summary(result).splitlines()}
    assert lines["cpu_us_per_req"][1:] == ["420.000", "340.000", "0.810", "0.750"]
    assert lines["idle_rss_mb"][-1] == "-"  # read once, not per round: no paired ratio
    assert "3 alternated rounds" in summary(result)


def test_a_latency_run_shows_only_what_it_measured() -> None:
    """``--latency`` skips the saturation phases: their metrics are left out, not shown as zero."""
    unmeasured = dict.fromkeys(("cpu_us_per_req", "rps", "cpu_us_per_stream", "streams_per_s"))
    rounds = [run(1.0, **unmeasured), run(1.0, **unmeasured)]  # type: ignore[arg-type]
    medians = {"idle_rss_mb": 50.0, **dict.fromkeys(METRICS[1:], 1.0), **unmeasured}
    result = {
        "rounds": 2,
        "runs": {"main": rounds, "branch": rounds},
        "medians": {"main": medians, "branch": medians},
        "load_average": [1.0, 2.0],
    }
    shown = {line.split()[0] for line in summary(result).splitlines()}
    assert "added_light_ttft_p50_ms" in shown and "idle_rss_mb" in shown
    assert not shown & set(unmeasured)
