"""Tiny worlds whose outcomes can be worked out by hand: a one-seat pool with a fixed 1 s TTFT and
100 tokens/s, and an API with a fixed 0.5 s TTFT and 50 tokens/s; requests placed at chosen times.
"""

from __future__ import annotations

from pathlib import Path

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import load_policy
from gateway.simulate.engine import PolicyRouter, Router, RunResult, Simulation
from gateway.simulate.workload import BackendModel, SimRequest, Workload, parse_start

POOL = BackendModel(
    profile="b300-vllm",
    overrides={"ttft_min_s": 1.0, "ttft_max_s": 1.0, "tokens_per_s": 100.0, "batching_exponent": 0.0,
               "max_running": 1, "prefill_s_per_token": 0.0},
)  # fmt: skip
API = BackendModel(
    profile="paid-api",
    overrides={
        "ttft_min_s": 0.5,
        "ttft_max_s": 0.5,
        "tokens_per_s": 50.0,
        "batching_exponent": 0.0,
        "prefill_s_per_token": 0.0,
    },
)


def tiny_policy(
    tmp: Path, route_extra: str = "", pool_extra: str = "", probes: bool = False, backends: str = "pool, api"
) -> CompiledPolicy:
    """``pool`` costs $36/h (assumed 100 tok/s: $100 per 1M), ``api`` $15 per 1M output tokens. No
    synthetic probes unless asked: they would take the one seat by hand-worked moments."""
    path = tmp / "tiny.yaml"
    path.write_text(f"""
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    thinking: none
    pricing: {{gpu_hours: {{usd_per_hour: 36, accounting: marginal, assumed_tokens_per_s: 100}}}}
    {pool_extra}
  api:
    dialect: openai
    url: http://127.0.0.1:9/v1
    model: m
    thinking: none
    pricing: {{per_token: {{input_usd_per_mtok: 0, output_usd_per_mtok: 15}}}}
routes:
  r:
    backends: [{backends}]
    slo: {{ttft_p95_ms: 1500}}
    exploration: 0
    {route_extra}
tuning: {{probes: {{enabled: {str(probes).lower()}}}}}
""")
    return load_policy(path)


def request(at: float, output: int = 101, prompt: int = 10, max_tokens: int | None = None) -> SimRequest:
    return SimRequest(at, "r", prompt, output, 0, max_tokens, True)


def tiny_workload(requests: list[SimRequest], duration_s: float = 3600.0, faults: tuple = ()) -> Workload:  # type: ignore[type-arg]
    return Workload(
        "tiny",
        requests,
        duration_s,
        parse_start("2026-01-01T00:00:00Z"),
        {"pool": POOL, "api": API},
        faults,
        0,
    )


def run(
    policy: CompiledPolicy, requests: list[SimRequest], router: Router | None = None, **kw: object
) -> RunResult:
    workload = tiny_workload(requests, **kw)  # type: ignore[arg-type]
    return Simulation(policy, workload, router or PolicyRouter("policy")).run()


def backends(result: RunResult) -> list[str | None]:
    return [o.backend for o in result.outcomes]


def ttfts(result: RunResult) -> list[float | None]:
    return [None if o.ttft_s is None else round(o.ttft_s, 6) for o in result.outcomes]
