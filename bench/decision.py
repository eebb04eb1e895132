"""Microbenchmark of one routing decision: one route over 50 backends (GPU-hour pools and per-token APIs)
with live statistics fed by traffic, timed as decide() alone, snapshot + decide, and the full per-request
cycle (snapshot, decide, attempt started/finished in the live stats)."""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

BACKENDS = 50


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def policy_text(backends: int) -> str:
    lines = ["version: 1", "backends:"]
    for i in range(backends):
        lines += [f"  b{i:02d}:", "    dialect: vllm" if i % 2 == 0 else "    dialect: openai"]
        lines += [f"    url: http://10.0.0.{i + 1}:8000/v1", "    model: kimi-k3", "    thinking: mandatory"]
        if i % 2 == 0:
            lines += ["    pricing:", f"      gpu_hours: {{usd_per_hour: {20 + i}, accounting: amortized}}"]
        else:
            lines += [
                "    pricing:",
                f"      per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: {5 + i}}}",
            ]
    names = ", ".join(f"b{i:02d}" for i in range(backends))
    lines += ["routes:", "  kimi-k3:", f"    backends: [{names}]", "    slo: {ttft_p95_ms: 3000}"]
    lines += ["    exploration: 0.02"]
    return "\n".join(lines) + "\n"


def finished_attempt(backend: str, started: float, ttft_s: float, tokens_per_s: float) -> Any:
    from gateway.values.observation import Attempt, Usage

    completion = 900
    return Attempt(
        backend=backend,
        started_at=started,
        ttft_s=ttft_s,
        first_answer_s=ttft_s * 5,
        finished_at=started + ttft_s + (completion - 1) / tokens_per_s,
        token_chunks=completion,
        usage=Usage(prompt_tokens=2000, completion_tokens=completion),
    )


def build(backends: int = BACKENDS, seed: int = 1) -> tuple[Any, Any, Any, Clock, random.Random]:
    """A compiled policy, its route, live stats with traffic on every backend, the clock and an rng."""
    from gateway.measure.signals import LoadSignals
    from gateway.measure.stats import LiveStats
    from gateway.policy.load import compile_policy_text

    policy = compile_policy_text(policy_text(backends), "bench-decision.yaml")
    route = policy.routes["kimi-k3"]
    clock = Clock()
    stats = LiveStats(clock)
    rng = random.Random(seed)
    for name in route.backends:
        for _ in range(64):
            ticket = stats.attempt_started(name)
            attempt = finished_attempt(name, clock.now, rng.uniform(0.4, 4.0), rng.uniform(9.0, 120.0))
            clock.now += 0.01
            stats.attempt_finished(ticket, attempt, route.name)
        if policy.backends[name].pool_price is not None:
            signals = LoadSignals(scraped_at=clock.now, running=rng.randint(1, 60), waiting=0)
            stats.update_signals(name, signals)
    return policy, route, stats, clock, rng


def _timed(n: int, step: Any) -> dict[str, float]:
    times = []
    gc.collect()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        step()
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return {
        "calls": n,
        "mean_us": sum(times) / n / 1000.0,
        "p50_us": times[n // 2] / 1000.0,
        "p99_us": times[int(n * 0.99)] / 1000.0,
    }


def run(iterations: int = 20_000, backends: int = BACKENDS) -> dict[str, Any]:
    from gateway.policy.decide import DecisionMemo, RequestFeatures, decide

    policy, route, stats, clock, rng = build(backends)
    req = RequestFeatures(route=route.name, prompt_tokens=2000, max_tokens=4096, stream=True)
    snapshot = stats.snapshot(route.backends)
    memo: DecisionMemo = {}  # as the Runtime keeps one: standings last until the stats publish new views
    decide_only = _timed(iterations, lambda: decide(req, route, policy, snapshot, rng, memo))

    def snapshot_and_decide() -> None:
        clock.now += 0.001  # 1000 requests/s: quantile caches expire every 100 requests
        decide(req, route, policy, stats.snapshot(route.backends), rng, memo)

    live = _timed(iterations, snapshot_and_decide)

    def full_cycle() -> None:
        clock.now += 0.001
        decision = decide(req, route, policy, stats.snapshot(route.backends), rng, memo)
        chosen = decision.order[0]
        ticket = stats.attempt_started(chosen)
        stats.attempt_finished(ticket, finished_attempt(chosen, clock.now, 0.9, 92.0), route.name)

    cycle = _timed(iterations, full_cycle)
    return {
        "backends": backends,
        "decide_only": decide_only,
        "snapshot_and_decide": live,
        "full_cycle": cycle,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--backends", type=int, default=BACKENDS)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run(args.iterations, args.backends)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for name in ("decide_only", "snapshot_and_decide", "full_cycle"):
        r = result[name]
        print(f"{name:22s} mean {r['mean_us']:7.1f} us  p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:7.1f} us")


if __name__ == "__main__":
    main()
