"""Routing quality: a seeded ramp that overloads pools paid by the hour (an 8-seat B300-like pool, a
2-slot A100-like pool with 7 s to its first token, a paid API; TTFT SLO 2 s) sent through the real
gateway against the emulators over HTTP, compared with the simulator's baselines and hindsight oracle
on the same requests: SLO attainment and total cost (pools for the whole run, the API per token).

    python -m bench.routing [--duration 300] [--time-scale 0.25] [--seed 11] [--json FILE]
    python -m bench.routing --workload agents [--sessions 24] [--sim-only] [--keys N]   (bench/agents.py)

The gateway runs the default-style policy below (lowest cost within the SLO, probes, waiting);
the baselines and the oracle run in the simulator (``gateway simulate``) over the same workload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from gateway.policy.load import load_policy
from gateway.simulate.baselines import baseline_names, make_router
from gateway.simulate.engine import Simulation
from gateway.simulate.report import quantile, summarize
from gateway.simulate.workload import SimRequest, Workload, WorkloadFile, synthesize
from tests.conftest import measured_gateway
from tests.simulate.fidelity import PAID_KEY, emulator_process, prompt_of

SLO_S = 2.0
POOL_USD_PER_HOUR = {"b300-vllm": 62.93, "a100-llamacpp": 20.09}
OVERRIDES: dict[str, dict[str, Any]] = {
    "b300-vllm": {"max_running": 8, "content_tokens": 100_000},
    "a100-llamacpp": {"content_tokens": 100_000},
    "paid-api": {"content_tokens": 100_000},
}


def policy_text(urls: dict[str, str], real_seconds: float) -> str:
    """The default-style policy; ``real_seconds`` turns emulated seconds into the gateway's real ones
    (its scraper and timeouts wait in real time, its stats run on the emulated clock)."""
    interval = 1.0 * real_seconds
    timeouts = f"{{first_byte_s: {600 * real_seconds:g}, idle_s: {600 * real_seconds:g}}}"
    return f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {urls["b300-vllm"]}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory
    max_concurrency: 8
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal, assumed_tokens_per_s: 92}}}}
    signals: {{metrics_url: {urls["b300-vllm"]}/metrics, health_url: {urls["b300-vllm"]}/health,
               interval_s: {interval:g}}}
    timeouts: {timeouts}
  a100-llamacpp:
    dialect: llamacpp
    url: {urls["a100-llamacpp"]}/v1
    model: kimi-k3-ud-iq1_s
    thinking: mandatory
    max_concurrency: 2
    pricing: {{gpu_hours: {{usd_per_hour: 20.09, accounting: marginal, assumed_tokens_per_s: 9}}}}
    signals: {{metrics_url: {urls["a100-llamacpp"]}/metrics, slots_url: {urls["a100-llamacpp"]}/slots,
               health_url: {urls["a100-llamacpp"]}/health, interval_s: {interval:g}}}
    timeouts: {timeouts}
  paid-api:
    dialect: openai
    url: {urls["paid-api"]}/v1
    model: kimi-k3
    api_key_env: FIDELITY_PAID_KEY
    thinking: mandatory
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {timeouts}
routes:
  kimi-k3:
    backends: [b300-vllm, paid-api, a100-llamacpp]
    slo: {{ttft_p95_ms: {SLO_S * 1000:g}}}
"""


def workload(duration_s: float, seed: int) -> Workload:
    spec = WorkloadFile.model_validate(
        {
            "name": "routing-ramp",
            "seed": seed,
            "duration_s": duration_s,
            "arrivals": {"ramp": {"from_rps": 0.3, "to_rps": 6.0}},
            "requests": {
                "prompt_tokens": {"median": 300, "sigma": 0.5, "min": 20, "max": 2000},
                "output_tokens": {"median": 120, "sigma": 0.5, "min": 16, "max": 600},
                "routes": {"kimi-k3": 1},
            },
            "backends": {
                name: {"profile": name, "overrides": changes} for name, changes in OVERRIDES.items()
            },
        }
    )
    synthetic = synthesize(spec)
    requests = [r._replace(max_tokens=r.output_tokens) for r in synthetic.requests]
    return synthetic._replace(requests=requests)


async def _send_all(base_url: str, requests: list[SimRequest], time_scale: float) -> Counter[int]:
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        started = time.monotonic()

        async def one(index: int, req: SimRequest) -> None:
            await asyncio.sleep(max(0.0, started + req.at * time_scale - time.monotonic()))
            body = {
                "model": req.route,
                "messages": [{"role": "user", "content": prompt_of(index, req.prompt_tokens)}],
                "max_tokens": req.max_tokens,
                "stream": True,
            }
            async with client.stream("POST", "/chat/completions", json=body) as response:
                await response.aread()
                statuses[response.status_code] += 1

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return statuses


def through_gateway(work: Workload, tmp: Path, time_scale: float) -> dict[str, Any]:
    os.environ["FIDELITY_PAID_KEY"] = PAID_KEY
    ledger = tmp / "routing.sqlite3"
    with emulator_process(time_scale) as urls:
        path = tmp / "gateway-policy.yaml"
        path.write_text(policy_text(urls, time_scale))
        with measured_gateway(path, ledger, time_scale) as gateway:
            statuses = asyncio.run(_send_all(gateway.base_url, work.requests, time_scale))
    conn = sqlite3.connect(ledger)
    rows = conn.execute("SELECT backend, cost_usd, ttft_s, status, cost_basis FROM requests").fetchall()
    probe_usd = conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM probes WHERE cost_basis = 'per_token'")
    paid_probes = float(probe_usd.fetchone()[0])
    conn.close()
    ok = [r for r in rows if r[3] == "ok"]
    within = [r for r in ok if r[2] is not None and r[2] <= SLO_S]
    api = sum(r[1] for r in ok if r[4] == "per_token") + paid_probes
    pools = sum(POOL_USD_PER_HOUR.values()) * work.duration_s / 3600.0
    answered = Counter(r[0] for r in ok)
    return {
        "name": "gateway (real, over HTTP)",
        "requests": len(rows),
        "statuses": dict(statuses),
        "failures": len(rows) - len(ok),
        "total_cost_usd": pools + api,
        "ttft_p95_s": quantile(sorted(r[2] for r in ok if r[2] is not None), 0.95),
        "slo_attainment": len(within) / len(rows) if rows else None,
        "share": {name: count / len(ok) for name, count in sorted(answered.items())},
    }


def through_simulator(work: Workload, tmp: Path) -> list[dict[str, Any]]:
    urls = {name: f"http://127.0.0.1:9/{name}" for name in OVERRIDES}  # never dialled
    path = tmp / "sim-policy.yaml"
    path.write_text(policy_text(urls, 1.0))
    os.environ["FIDELITY_PAID_KEY"] = PAID_KEY
    policy = load_policy(path)
    return [
        summarize(Simulation(policy, work, make_router(name, policy), seed=7).run())
        for name in baseline_names(policy)
    ]


def table(rows: list[dict[str, Any]], oracle_usd: float) -> str:
    lines = [
        "| router | total $ | vs oracle | TTFT p95 | SLO attainment | failed | share |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        share = ", ".join(f"{k.split('-')[0]} {v:.0%}" for k, v in row["share"].items() if v >= 0.005)
        p95 = row["ttft_p95_s"]
        lines.append(
            f"| {row['name']} | {row['total_cost_usd']:.2f} | {row['total_cost_usd'] / oracle_usd - 1:+.1%} "
            f"| {'-' if p95 is None else f'{p95:.2f}s'} | {row['slo_attainment']:.2%} | {row['failures']} "
            f"| {share} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="emulated seconds of ramp")
    parser.add_argument("--time-scale", type=float, default=0.25, help="real seconds per emulated one")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", type=Path, default=None, help="also write every number here")
    parser.add_argument("--workload", choices=("ramp", "agents"), default="ramp")
    parser.add_argument("--sessions", type=int, default=None, help="agents: sessions (default: the file's)")
    parser.add_argument("--sim-only", action="store_true", help="agents: the simulator's rows only")
    parser.add_argument(
        "--keys",
        type=int,
        default=0,
        help="agents: API keys the sessions use, each its own cache scope (0: none)",
    )
    args = parser.parse_args()
    if args.workload == "agents":
        from bench import agents

        # The agents run 30 emulated minutes: 3 real ones. Faster, the real overhead of 1 MB prompts
        # reads 20x in emulated TTFT (at 0.05 the real gateway paid 3% more than the simulated one).
        scale = 0.1 if args.time_scale == 0.25 else args.time_scale
        seed = None if args.seed == 11 else args.seed
        with tempfile.TemporaryDirectory() as tmp:
            print(agents.run(args.sessions, seed, scale, args.sim_only, Path(tmp), args.keys))
        return
    work = workload(args.duration, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        gateway = through_gateway(work, Path(tmp), args.time_scale)
        baselines = through_simulator(work, Path(tmp))
    oracle = next(b for b in baselines if b["name"] == "oracle")
    print(
        f"{len(work.requests)} requests over a {args.duration:g} s ramp (seed {args.seed}),",
        f"TTFT SLO {SLO_S:g} s",
    )
    print(table([gateway, *baselines], oracle["total_cost_usd"]))
    if args.json is not None:
        args.json.write_text(json.dumps({"gateway": gateway, "baselines": baselines}, indent=2, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
