"""Agent routing: coding-agent sessions (bench/workloads/agents.yaml) through the real gateway over HTTP
against the emulators (two B300-like replicas of one pool, ``family: kimi-k3``, and the paid API), and
through the simulator with the gateway's own decision and the baselines on the same requests.

    python -m bench.routing --workload agents [--sessions 24] [--seed 1] [--time-scale 0.1] [--sim-only]
        [--keys N]

``--keys N``: the sessions use N API keys (session i the key i % N), so the route isolates each key's
prefix cache (``prefix_cache: {share: key}``, its default with more than one key): the engines get each
key's cache_salt and the index is kept per key. 0 (the default): no keys, one cache for all.

Total cost counts both replicas for the whole run (paid by the hour) plus the API's tokens at their
cached and uncached prices; cache hit rate is cached over all prompt tokens answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from gateway.emulator import create_emulator_app
from gateway.policy.load import load_policy
from gateway.simulate.agent_routers import AGENT_BASELINES, GATEWAY, make_agent_router
from gateway.simulate.agents import agent_workload, read_agents_file
from gateway.simulate.engine import Simulation
from gateway.simulate.report import quantile, summarize
from gateway.simulate.workload import SimRequest, Workload, backend_profile

WORKLOAD = Path(__file__).parent / "workloads" / "agents.yaml"
SLO_S = 8.0
POOL_USD_PER_HOUR = 62.93
PAID_KEY = "agents-paid-key"
REPLICAS = ("b300-a", "b300-b")
KV_CAPACITY_TOKENS = 2_097_152  # each replica's KV cache, as the workload's profiles have it
BACKENDS = (*REPLICAS, "paid-api")


def api_key(index: int) -> str:
    return f"gwk-agents-{index:04d}-0123456789abcdefghijklmnopqrstuvwxyz"


def auth_text(keys: int) -> str:
    """``keys`` API keys for the sessions (none: an open gateway, one cache scope)."""
    if not keys:
        return ""
    from gateway.values.auth import digest_of

    entries = "".join(f"    - {{name: agents-{i}, sha256: {digest_of(api_key(i))}}}\n" for i in range(keys))
    return f"auth:\n  keys:\n{entries}"


def policy_text(urls: dict[str, str], real_seconds: float, keys: int = 0) -> str:
    """Two replicas of one pool and the API, lowest cost within a TTFT SLO; ``real_seconds`` turns
    emulated seconds into the gateway's real ones (its scraper and timeouts wait in real time)."""
    interval = 1.0 * real_seconds
    # The policy's default timeouts (120 s to the first byte, 60 s idle), in the emulators' time.
    timeouts = f"{{first_byte_s: {120 * real_seconds:g}, idle_s: {60 * real_seconds:g}}}"
    replicas = "".join(
        f"""
  {name}:
    dialect: vllm
    url: {urls[name]}/v1
    model: moonshotai/Kimi-K3
    family: kimi-k3
    thinking: mandatory
    max_concurrency: 8
    prefix_cache: {{capacity_tokens: {KV_CAPACITY_TOKENS}}}
    pricing:
      gpu_hours: {{usd_per_hour: {POOL_USD_PER_HOUR}, accounting: marginal, assumed_tokens_per_s: 92}}
    signals: {{metrics_url: {urls[name]}/metrics, health_url: {urls[name]}/health, interval_s: {interval:g}}}
    timeouts: {timeouts}"""
        for name in REPLICAS
    )
    return f"""
backends:{replicas}
  paid-api:
    dialect: openai
    url: {urls["paid-api"]}/v1
    model: kimi-k3
    family: kimi-k3
    api_key_env: AGENTS_PAID_KEY
    thinking: mandatory
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {timeouts}
routes:
  kimi-k3:
    backends: [{", ".join(BACKENDS)}]
    slo: {{ttft_p95_ms: {SLO_S * 1000:g}}}
    exploration: 0
""" + auth_text(keys)


def workload(sessions: int | None = None, seed: int | None = None, keys: int = 0) -> Workload:
    spec = read_agents_file(WORKLOAD)
    changes = {k: v for k, v in (("sessions", sessions), ("seed", seed), ("keys", keys)) if v is not None}
    work = agent_workload(spec.model_copy(update=changes))
    # Each request asks for exactly its length, as the emulators need to stop there.
    return work._replace(requests=[r._replace(max_tokens=r.output_tokens) for r in work.requests])


def through_simulator(work: Workload, tmp: Path, keys: int = 0) -> list[dict[str, Any]]:
    os.environ["AGENTS_PAID_KEY"] = PAID_KEY
    path = tmp / "sim-policy.yaml"
    path.write_text(policy_text({name: f"http://127.0.0.1:9/{name}" for name in BACKENDS}, 1.0, keys))
    policy = load_policy(path)
    rows = []
    for name in (GATEWAY, *AGENT_BASELINES):
        row = summarize(Simulation(policy, work, make_agent_router(name, policy), seed=7).run())
        row["name"] = "gateway (simulated)" if name == GATEWAY else name
        rows.append(row)
    return rows


# -- over HTTP ----------------------------------------------------------------------------------------


def message_text(session: int, index: int, tokens: int) -> str:
    """A message of ``tokens`` x 4 characters: the shared prefix (index 0) is the same in every session,
    every other message unique to its session and turn from its first characters."""
    head = "system prompt and tools " if index == 0 else f"session {session:04d} message {index:03d} "
    return head + "x" * max(0, 4 * tokens - len(head))


def messages_of(req: SimRequest) -> list[dict[str, str]]:
    assert req.shape is not None
    ends = req.shape[0]
    out = []
    previous = 0
    for index, end in enumerate(ends):
        role = "system" if index == 0 else "user" if index % 2 else "assistant"
        out.append({"role": role, "content": message_text(req.session, index, end - previous)})
        previous = end
    return out


@contextlib.contextmanager
def emulators(work: Workload, time_scale: float, ports: list[int]) -> Iterator[None]:
    """The replicas' and the API's emulators with the workload's profiles, on ``ports``, in this process."""
    from tests.servers import threaded_server

    apps = []
    for seed, name in enumerate(BACKENDS, 1):
        dialect = "openai" if name == "paid-api" else "vllm"
        profile = backend_profile(work.backends.get(name), dialect).with_overrides(
            {"content_tokens": 100_000}
        )
        if name == "paid-api":
            os.environ["EMULATOR_API_KEY"] = PAID_KEY
        try:
            apps.append(create_emulator_app(profile, time_scale=time_scale, seed=seed))
        finally:
            os.environ.pop("EMULATOR_API_KEY", None)
    with contextlib.ExitStack() as stack:
        for app, port in zip(apps, ports, strict=True):
            stack.enter_context(threaded_server(app, port))
        yield


async def _send_all(
    base_url: str, requests: list[SimRequest], time_scale: float, keys: int = 0
) -> Counter[int]:
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        started = time.monotonic()

        async def one(req: SimRequest) -> None:
            await asyncio.sleep(max(0.0, started + req.at * time_scale - time.monotonic()))
            body = {
                "model": req.route,
                "messages": messages_of(req),
                "max_tokens": req.max_tokens,
                "stream": True,
            }
            headers = {"authorization": f"Bearer {api_key(req.session % keys)}"} if keys else {}
            async with client.stream("POST", "/chat/completions", json=body, headers=headers) as response:
                await response.aread()
                statuses[response.status_code] += 1

        await asyncio.gather(*(one(r) for r in requests))
    return statuses


def through_gateway(work: Workload, tmp: Path, time_scale: float, keys: int = 0) -> dict[str, Any]:
    from tests.conftest import measured_gateway
    from tests.servers import ProcessServer, free_port, python_module, wait_http

    os.environ["AGENTS_PAID_KEY"] = PAID_KEY
    ledger = tmp / "agents.sqlite3"
    ports = [free_port() for _ in BACKENDS]
    args = ["--serve", str(time_scale), str(work.seed), str(len({r.session for r in work.requests}))]
    server = ProcessServer(python_module("bench.agents", *args, *map(str, ports))).start()
    try:
        urls = {name: f"http://127.0.0.1:{port}" for name, port in zip(BACKENDS, ports, strict=True)}
        for url in urls.values():
            wait_http(url + "/health")
        path = tmp / "gateway-policy.yaml"
        path.write_text(policy_text(urls, time_scale, keys))
        with measured_gateway(path, ledger, time_scale) as gateway:
            statuses = asyncio.run(_send_all(gateway.base_url, work.requests, time_scale, keys))
    finally:
        server.stop()
    return ledger_summary(ledger, work, statuses)


def ledger_summary(ledger: Path, work: Workload, statuses: Counter[int]) -> dict[str, Any]:
    conn = sqlite3.connect(ledger)
    rows = conn.execute(
        "SELECT backend, cost_usd, ttft_s, status, cost_basis, prompt_tokens, cached_prompt_tokens,"
        " completion_tokens, predicted_cached_tokens FROM requests"
    ).fetchall()
    probe_usd = conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM probes WHERE cost_basis = 'per_token'")
    paid_probes = float(probe_usd.fetchone()[0])
    conn.close()
    ok = [r for r in rows if r[3] == "ok"]
    within = [r for r in ok if r[2] is not None and r[2] <= SLO_S]
    api = sum(r[1] or 0.0 for r in ok if r[4] == "per_token") + paid_probes
    total = len(REPLICAS) * POOL_USD_PER_HOUR * work.duration_s / 3600.0 + api
    output = sum(r[7] or 0 for r in ok)
    prompt = sum(r[5] or 0 for r in ok)
    answered = Counter(r[0] for r in ok)
    return {
        "name": "gateway (real, over HTTP)",
        "requests": len(rows),
        "statuses": dict(statuses),
        "failures": len(work.requests) - len(ok),
        "total_cost_usd": total,
        "usd_per_mtok_out": total / output * 1e6 if output else None,
        "ttft_p95_s": quantile(sorted(r[2] for r in ok if r[2] is not None), 0.95),
        "slo_attainment": len(within) / len(work.requests) if work.requests else None,
        "cache_hit_rate": sum(r[6] or 0 for r in ok) / prompt if prompt else None,
        "share": {name: count / len(ok) for name, count in sorted(answered.items())},
        # The index's prediction against what the emulators reported, over the answered requests.
        "predicted_cached_tokens": sum(r[8] or 0 for r in ok),
        "reported_cached_tokens": sum(r[6] or 0 for r in ok),
        "cached_abs_error_tokens": sum(abs((r[8] or 0) - (r[6] or 0)) for r in ok),
    }


def table(rows: list[dict[str, Any]], oracle_usd: float) -> str:
    lines = [
        "| router | total $ | vs oracle | $/1M out | TTFT p95 | SLO | cache hit | share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        share = ", ".join(f"{k.removeprefix('b300-')} {v:.0%}" for k, v in row["share"].items() if v >= 0.005)
        p95, hit, per = row["ttft_p95_s"], row["cache_hit_rate"], row["usd_per_mtok_out"]
        lines.append(
            f"| {row['name']} | {row['total_cost_usd']:.2f} | {row['total_cost_usd'] / oracle_usd - 1:+.1%} "
            f"| {'-' if per is None else f'{per:.0f}'} | {'-' if p95 is None else f'{p95:.1f}s'} "
            f"| {100 * (row['slo_attainment'] or 0):.1f}% | {'-' if hit is None else f'{hit:.0%}'} "
            f"| {share} |"
        )
    return "\n".join(lines)


def run(
    sessions: int | None, seed: int | None, time_scale: float, sim_only: bool, tmp: Path, keys: int = 0
) -> str:
    work = workload(sessions, seed, keys)
    simulated = through_simulator(work, tmp, keys)
    rows = simulated if sim_only else [through_gateway(work, tmp, time_scale, keys), *simulated]
    oracle = next(r for r in simulated if r["name"] == "session-oracle")
    prompt = sum(r.prompt_tokens for r in work.requests)
    head = (
        f"{len(work.requests)} turns of {len({r.session for r in work.requests})} agent sessions over "
        f"{work.duration_s:g} s (seed {work.seed}), {prompt / 1e6:.0f}M prompt tokens, TTFT SLO {SLO_S:g} s, "
        + (
            f"{keys} API keys (session i uses key i % {keys}), each its own cache scope"
            if keys
            else "one cache scope"
        )
    )
    lines = [head, table(rows, oracle["total_cost_usd"])]
    if not sim_only:
        real = rows[0]
        reported = real["reported_cached_tokens"] or 1
        lines.append(
            f"gateway over HTTP: predicted {real['predicted_cached_tokens'] / 1e6:.1f}M cached tokens, "
            f"reported {real['reported_cached_tokens'] / 1e6:.1f}M, absolute error "
            f"{real['cached_abs_error_tokens'] / reported:.1%} of reported"
        )
    return "\n".join(lines)


def serve(argv: list[str]) -> None:
    """``--serve TIME_SCALE SEED SESSIONS PORT...``: the emulators in a process of their own."""
    time_scale, seed, sessions = float(argv[0]), int(argv[1]), int(argv[2])
    ports = [int(p) for p in argv[3:]]
    with emulators(workload(sessions, seed), time_scale, ports):
        while True:
            time.sleep(3600)


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve(sys.argv[2:])
