"""Two gateway checkouts side by side on one upstream: ``python -m bench.ab_server A_DIR B_DIR [--rounds N]``.

Each checkout's gateway runs from its own directory with ``PYTHONPATH`` set to it (so each imports its
own ``gateway`` package), both at once, pinned to core 0 like ``bench.run``'s; the upstream and this load
generator share core 1. Each round measures one and then the other, the order alternating, so that other
people's load on a shared machine falls on both alike. Idle memory is read once, at the start; each round
reads the added latency at c=1 (p50 over going direct, measured in the same round), the added TTFT of
streams started at 5 a second (open loop), and the gateway's own CPU per request at saturation (c=64),
whole answers and streams. Prints the medians per checkout and B's ratio to A.

``--latency`` measures only the two latencies, with a longer light phase (60 streams a round, not 20):
the saturation phases are skipped, so more rounds fit in the same minutes, and a p50 of light TTFT is
read over three times the streams (it is a p50 of a few dozen on a machine whose load keeps moving).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import servers
from bench.loadgen import open_loop, percentile
from bench.procs import Proc, pin_self, start
from bench.suite import MB, Settings, Way, at_c1, saturation, wait_ready
from bench.tracing import free_port

OUT = servers.BENCH / "results" / "ab_server"
LIGHT_STREAMS_PER_S = 5.0
METRICS = (
    "idle_rss_mb",
    "c1_p50_ms",
    "added_c1_p50_ms",
    "light_ttft_p50_ms",
    "added_light_ttft_p50_ms",
    "cpu_us_per_req",
    "rps",
    "cpu_us_per_stream",
    "streams_per_s",
    "core_foreign_share",
)


def start_gateway(checkout: Path, label: str, port: int, policy: Path, out_dir: Path) -> Proc:
    ledger = out_dir / f"ledger-{label}.sqlite3"
    for stale in out_dir.glob(f"ledger-{label}.sqlite3*"):
        stale.unlink()
    argv = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port)]
    argv += ["--ledger", str(ledger)]
    env = {"PYTHONPATH": str(checkout), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    cwd = os.getcwd()
    os.chdir(checkout)  # `start` spawns in the current directory
    try:
        return start(f"gateway-{label}", argv, cpus="0", log_dir=out_dir, env=env)
    finally:
        os.chdir(cwd)


async def light_ttft(way: Way, seconds: float) -> float | None:
    """TTFT p50 (ms) of streams started at LIGHT_STREAMS_PER_S whatever the answers do."""
    r = await open_loop(way.target(True), LIGHT_STREAMS_PER_S, seconds)
    p50 = percentile(r.ttfts, 0.5)
    return None if p50 is None else p50 * 1000.0


async def one_run(
    way: Way, direct: dict[str, float | None], s: Settings, light_s: float, latency_only: bool = False
) -> dict[str, Any]:
    c1 = await at_c1(way, s, False)
    ttft = await light_ttft(way, light_s)
    if latency_only:
        return {
            **dict.fromkeys(METRICS[5:]),
            "c1_p50_ms": c1["p50_ms"],
            "added_c1_p50_ms": c1["p50_ms"] - direct["c1_p50_ms"],  # type: ignore[operator]
            "light_ttft_p50_ms": ttft,
            "added_light_ttft_p50_ms": None if ttft is None else ttft - direct["light_ttft_p50_ms"],  # type: ignore[operator]
            "core_foreign_share": c1.get("core_foreign_share") or 0.0,
            "errors": c1["errors"],
        }
    whole = await saturation(way, s, False)
    streamed = await saturation(way, s, True)
    return {
        "c1_p50_ms": c1["p50_ms"],
        "added_c1_p50_ms": c1["p50_ms"] - direct["c1_p50_ms"],  # type: ignore[operator]
        "light_ttft_p50_ms": ttft,
        "added_light_ttft_p50_ms": None if ttft is None else ttft - direct["light_ttft_p50_ms"],  # type: ignore[operator]
        "cpu_us_per_req": (whole.get("cpu_ms_per_req") or 0.0) * 1000.0,
        "rps": whole["rps"],
        "cpu_us_per_stream": (streamed.get("cpu_ms_per_stream") or 0.0) * 1000.0,
        "streams_per_s": streamed["rps"],
        "core_foreign_share": max(
            whole.get("core_foreign_share") or 0.0, c1.get("core_foreign_share") or 0.0
        ),
        "errors": whole["errors"] + streamed["errors"] + c1["errors"],
    }


async def compare(
    checkouts: dict[str, Path], rounds: int, quick: bool, out_dir: Path, latency_only: bool = False
) -> dict[str, Any]:
    """Both gateways run side by side on core 0 from the start; each round measures one, then the
    other (the order alternating), so a noisy spell of the machine falls on both."""
    s = Settings.make(quick, None)
    light_s = 12.0 if latency_only else 4.0 if quick else 8.0
    upstream_port = free_port()
    upstream = servers.start_upstream(upstream_port, out_dir)
    policy = servers.gateway_policy(upstream_port, out_dir)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in checkouts}
    idle_rss: dict[str, float] = {}
    loads: list[float] = []
    ways: dict[str, Way] = {}
    try:
        direct_way = Way("direct", upstream_port, upstream, "fast", "paced", servers.API_KEY)
        if await wait_ready(direct_way, 20.0) is None:
            raise SystemExit("the upstream did not start:\n" + upstream.log_tail())
        for label, checkout in checkouts.items():
            port = free_port()
            proc = start_gateway(checkout, label, port, policy, out_dir)
            ways[label] = Way("ours", port, proc, "bench-fast", "bench-paced", servers.API_KEY, upstream)
        for label, way in ways.items():
            if await wait_ready(way, 120.0) is None:
                raise SystemExit(f"gateway {label} did not start:\n" + way.proc.log_tail())
        await asyncio.sleep(2.0)
        idle_rss = {label: way.proc.rss_bytes() / MB for label, way in ways.items()}
        labels = list(checkouts)
        for round_no in range(rounds):
            c1 = await at_c1(direct_way, s, False)
            direct = {"c1_p50_ms": c1["p50_ms"], "light_ttft_p50_ms": await light_ttft(direct_way, light_s)}
            for label in labels if round_no % 2 == 0 else labels[::-1]:
                run = await one_run(ways[label], direct, s, light_s, latency_only)
                loads.append(os.getloadavg()[0])
                runs[label].append(run)
                print(f"round {round_no + 1} {label}: " + json.dumps({k: _round(v) for k, v in run.items()}))
    finally:
        for way in ways.values():
            way.proc.stop()
        upstream.stop()
    medians = {
        label: {
            "idle_rss_mb": idle_rss[label],
            **{m: _median([r[m] for r in rs if r[m] is not None]) for m in METRICS[1:]},
        }
        for label, rs in runs.items()
    }
    return {"rounds": rounds, "runs": runs, "medians": medians, "load_average": [min(loads), max(loads)]}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None  # None: not measured (``--latency``)


def _round(v: Any) -> Any:
    return round(v, 3) if isinstance(v, float) else v


def summary(result: dict[str, Any]) -> str:
    """Medians per checkout, their ratio, and the median of the rounds' own ratios (each round measured
    both within seconds of each other: the steadier figure on a machine whose load keeps moving)."""
    a, b = result["medians"]
    lines = [f"{'metric':26} {a:>10} {b:>10} {b + '/' + a:>12} {'paired':>8}"]
    for m in METRICS:
        va, vb = result["medians"][a][m], result["medians"][b][m]
        if va is None or vb is None:
            continue  # not measured in this run
        ratio = f"{vb / va:.3f}" if va else "-"
        pairs = [
            rb[m] / ra[m]
            for ra, rb in zip(result["runs"][a], result["runs"][b], strict=True)
            if ra.get(m) and rb.get(m)
        ]
        paired = f"{statistics.median(pairs):.3f}" if pairs else "-"
        lines.append(f"{m:26} {va:10.3f} {vb:10.3f} {ratio:>12} {paired:>8}")
    lo, hi = result["load_average"]
    lines.append(f"medians of {result['rounds']} alternated rounds; 1-min load average {lo:.1f}-{hi:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_server", description=__doc__)
    parser.add_argument("a", type=Path, nargs="?", help="the first checkout (e.g. main's)")
    parser.add_argument("b", type=Path, nargs="?", help="the second checkout (e.g. a branch's)")
    parser.add_argument("--labels", default="main,branch", help="names of the two, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="short phases (3 s saturation)")
    parser.add_argument(
        "--latency", action="store_true", help="only the c=1 and light-load latencies (12 s light phase)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--summary", type=Path, help="print the summary of an earlier run's JSON and stop")
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(summary(json.loads(args.summary.read_text())))
        return 0
    if args.a is None or args.b is None:
        parser.error("name the two checkouts")
    label_a, label_b = args.labels.split(",")
    pin_self({1})
    args.out.mkdir(parents=True, exist_ok=True)
    import uvloop

    checkouts = {label_a: args.a.resolve(), label_b: args.b.resolve()}
    started = time.time()
    result = uvloop.run(compare(checkouts, args.rounds, args.quick, args.out, args.latency))
    result["wall_s"] = time.time() - started
    (args.out / "ab_server.json").write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
