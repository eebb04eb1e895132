"""The fidelity comparison: one seeded ramp sent through the real gateway against three emulated pools
over HTTP, and through the simulator, with the same profiles and policy; both summarized alike.

``python -m tests.simulate.fidelity 300 [RUNS] [--probes] [--spell] [--death] [--declared-seats]`` runs a
longer version and prints both sides (``--spell``: the B300 pool slowed by 4 s for a fifth of the run;
``--death``: the B300 pool dies mid-run under its streams and stays down a tenth of the run, the streams
it cut resumed on the paid API;
``--probes``: probes on; ``--declared-seats``: the policy gives the pool its 8 seats as
``max_concurrency``); with ``RUNS`` over 1, the gateway that many times and the simulator over as many
seeds, one line each: the spread a single comparison draws from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from gateway.emulator import PROFILES, create_emulator_app
from gateway.emulator.profiles import Profile
from gateway.policy.load import load_policy
from gateway.simulate.engine import PolicyRouter, RunResult, Simulation
from gateway.simulate.report import quantile, summarize
from gateway.simulate.workload import SimRequest, Workload, WorkloadFile, synthesize
from tests.conftest import emulated_clock, running_gateway
from tests.servers import ProcessServer, free_port, python_module, threaded_server, wait_http

TIME_SCALE = float(os.environ.get("FIDELITY_TIME_SCALE", "0.25"))
PAID_KEY = "fidelity-paid-key"
SEATS = 8  # a small B300 pool, so a short ramp overloads it
SPELL_ADDED_TTFT_MS = 4000.0
DEATH_AT, DOWN_FOR = 0.5, 0.1  # shares of the run: when the B300 pool dies, and how long it stays down
# With probes on and the policy's default max_concurrency (64) in front of the pool's 8 seats, the
# gateway learns of the pool's queue only from the TTFTs it causes: back from an exclusion, the pool is
# filled until its p95 crosses the SLO, and whether it takes one more burst turns on hundredths of a
# second. Both sides play that cycle alike (their timelines match step by step), but one run of either
# is a draw: 120 s ramp with the spell, B300 share 34-38% and TTFT p95 2.7-2.8 or 3.2-3.6 s over 20
# simulator seeds, 20-42% and 2.4-3.5 s over 15 gateway runs (the lowest with the machine busy). The
# probes-on comparison therefore gives the pool its real seats (``declared_seats``); ``--probes
# --spell`` alone runs the undeclared one.
PROBES_OFF = "tuning: {probes: {enabled: false}}\n"
# Long answers from the emulators; each request's max_tokens sets its real length.
OVERRIDES: dict[str, dict[str, Any]] = {
    "b300-vllm": {"max_running": SEATS, "content_tokens": 100_000},
    "a100-llamacpp": {"content_tokens": 100_000},
    "paid-api": {"content_tokens": 100_000},
}


def profiles() -> dict[str, Profile]:
    return {name: PROFILES[name].with_overrides(changes) for name, changes in OVERRIDES.items()}


def policy_text(
    urls: dict[str, str],
    real_seconds: float,
    probes: bool = False,
    declared_seats: bool = False,
    resuming: bool = False,
) -> str:
    """The policy both sides run; ``real_seconds`` turns emulated seconds into the gateway's real ones
    (its scraper and timeouts wait in real time; its stats run on the emulated clock).
    ``declared_seats``: the policy gives the B300 pool its real seats as ``max_concurrency`` (else the
    default 64, and the gateway learns of the pool's queue from its metrics). ``resuming``: the three
    are one family and the paid API continues a partial answer, as in the default policy, so a stream
    cut mid-way is resumed (without it the route resumes nothing: the families differ)."""
    interval = 1.0 * real_seconds
    seats = f"\n    max_concurrency: {SEATS}" if declared_seats else ""
    family = "\n    family: kimi-k3" if resuming else ""
    partial = "\n    resume: partial" if resuming else ""
    timeouts = f"{{first_byte_s: {600 * real_seconds:g}, idle_s: {600 * real_seconds:g}}}"
    return f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {urls["b300-vllm"]}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory{seats}{family}
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal, assumed_tokens_per_s: 92}}}}
    signals: {{metrics_url: {urls["b300-vllm"]}/metrics, health_url: {urls["b300-vllm"]}/health,
               interval_s: {interval:g}}}
    timeouts: {timeouts}
  a100-llamacpp:
    dialect: llamacpp
    url: {urls["a100-llamacpp"]}/v1
    model: kimi-k3-ud-iq1_s
    thinking: mandatory
    max_concurrency: 4{family}
    pricing: {{gpu_hours: {{usd_per_hour: 20.09, accounting: marginal, assumed_tokens_per_s: 9}}}}
    signals: {{metrics_url: {urls["a100-llamacpp"]}/metrics, slots_url: {urls["a100-llamacpp"]}/slots,
               health_url: {urls["a100-llamacpp"]}/health, interval_s: {interval:g}}}
    timeouts: {timeouts}
  paid-api:
    dialect: openai
    url: {urls["paid-api"]}/v1
    model: kimi-k3
    api_key_env: FIDELITY_PAID_KEY
    thinking: mandatory{family}{partial}
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {timeouts}
routes:
  kimi-k3:
    backends: [b300-vllm, paid-api, a100-llamacpp]
    slo: {{ttft_p95_ms: 3000, min_decode_tokens_per_s: 20}}
    exploration: 0
{"" if probes else PROBES_OFF}"""


def spell(duration_s: float) -> dict[str, Any]:
    """The B300 pool's first token 4 s later for a fifth of the run, while it carries most traffic."""
    start = 0.25 * duration_s
    return {"backend": "b300-vllm", "kind": "slow", "start_s": start, "end_s": start + 0.2 * duration_s,
            "added_ttft_ms": SPELL_ADDED_TTFT_MS}  # fmt: skip


def death(duration_s: float) -> dict[str, Any]:
    """The B300 pool dies half-way, while it carries a full house of streams, and is down a tenth of the
    run: the simulator's ``down`` fault, the emulator's ``dies_for_s``."""
    start = DEATH_AT * duration_s
    return {"backend": "b300-vllm", "kind": "down", "start_s": start, "end_s": start + DOWN_FOR * duration_s}


def workload(
    duration_s: float, seed: int = 11, with_spell: bool = False, with_death: bool = False
) -> Workload:
    spec = WorkloadFile.model_validate(
        {
            "name": "fidelity-ramp",
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
            "faults": [spell(duration_s)] * with_spell + [death(duration_s)] * with_death,
        }
    )
    synthetic = synthesize(spec)
    # Each request asks for exactly its length, as the gateway run must (the emulators stop there).
    requests = [r._replace(max_tokens=r.output_tokens) for r in synthetic.requests]
    return synthetic._replace(requests=requests)


@contextlib.contextmanager
def emulators(time_scale: float, ports: list[int]) -> Iterator[None]:
    """The three emulators with the comparison's profiles, on ``ports``, in this process."""
    os.environ["EMULATOR_API_KEY"] = PAID_KEY
    try:
        chosen = profiles()
        paid = create_emulator_app(chosen["paid-api"], time_scale=time_scale, seed=3)
    finally:
        del os.environ["EMULATOR_API_KEY"]
    vllm = create_emulator_app(chosen["b300-vllm"], time_scale=time_scale, seed=1)
    llama = create_emulator_app(chosen["a100-llamacpp"], time_scale=time_scale, seed=2)
    with threaded_server(vllm, ports[0]), threaded_server(llama, ports[1]), threaded_server(paid, ports[2]):
        yield


@contextlib.contextmanager
def emulator_process(time_scale: float) -> Iterator[dict[str, str]]:
    """The emulators in a process of their own, so they do not share the gateway's interpreter lock."""
    ports = [free_port() for _ in range(3)]
    command = python_module("tests.simulate.fidelity", "--serve", str(time_scale), *map(str, ports))
    server = ProcessServer(command).start()
    try:
        urls = {name: f"http://127.0.0.1:{port}" for name, port in zip(OVERRIDES, ports, strict=True)}
        for url in urls.values():
            wait_http(url + "/health")
        yield urls
    finally:
        server.stop()


def prompt_of(index: int, tokens: int) -> str:
    """``tokens`` x 4 characters, unique from the first one so no prefix cache helps."""
    head = f"request {index:06d} "
    return head + "x" * max(0, 4 * tokens - len(head))


async def _send_all(
    base_url: str,
    requests: list[SimRequest],
    time_scale: float,
    faults: list[tuple[float, str, dict[str, Any]]],
) -> Counter[int]:
    """Send ``requests`` on their schedule; ``faults`` are (emulated s, emulator URL, knobs to set)."""
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        started = time.monotonic()

        async def inject(at: float, url: str, knobs: dict[str, Any]) -> None:
            await asyncio.sleep(max(0.0, started + at * time_scale - time.monotonic()))
            answer = await client.post(url + "/emulator/faults", json=knobs)
            answer.raise_for_status()

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

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)), *(inject(*f) for f in faults))
    return statuses


def through_gateway(
    work: Workload,
    tmp: Path,
    time_scale: float = TIME_SCALE,
    probes: bool = False,
    declared_seats: bool = False,
    resuming: bool = False,
) -> dict[str, Any]:
    os.environ["FIDELITY_PAID_KEY"] = PAID_KEY
    with emulator_process(time_scale) as urls:
        path = tmp / "gateway-policy.yaml"
        path.write_text(policy_text(urls, time_scale, probes, declared_seats, resuming))
        options = {
            "clock": emulated_clock(time_scale),
            "rng": random.Random(7),
            "ledger_path": tmp / "l.sqlite3",
        }
        faults: list[tuple[float, str, dict[str, Any]]] = []
        for fault in work.faults:
            url = urls[fault.backend]
            if fault.kind == "down":  # dies at its start, back by itself at its end
                faults.append((fault.start_s, url, {"dies_for_s": fault.end_s - fault.start_s}))
                continue
            slow, normal = {"added_ttft_ms": fault.added_ttft_ms}, {"added_ttft_ms": 0.0}
            faults += [(fault.start_s, url, slow), (fault.end_s, url, normal)]
        with running_gateway(path, **options) as gateway:
            statuses = asyncio.run(_send_all(gateway.base_url, work.requests, time_scale, faults))
    conn = sqlite3.connect(tmp / "l.sqlite3")
    query = "SELECT backend, cost_usd, ttft_s, status, cost_basis, attempt_log FROM requests"
    rows = conn.execute(query).fetchall()
    probe_rows = conn.execute("SELECT backend, cost_usd, cost_basis FROM probes").fetchall()
    conn.close()
    ok = [r for r in rows if r[3] == "ok"]
    answered = Counter(r[0] for r in ok)
    # The paid API's bill: users' requests and probes (the simulator counts both).
    api = sum(r[1] for r in ok if r[4] == "per_token") + sum(r[1] for r in probe_rows if r[2] == "per_token")
    pools = (62.93 + 20.09) * work.duration_s / 3600.0
    return {
        "requests": len(rows),
        "statuses": dict(statuses),
        "failures": len(rows) - len(ok),
        "resumed": sum(any(a["resumed"] for a in json.loads(r[5] or "[]")) for r in rows),
        "api_usd": api,
        "total_cost_usd": pools + api,
        "ttft_p95_s": quantile(sorted(r[2] for r in ok if r[2] is not None), 0.95),
        "share": {name: count / len(ok) for name, count in answered.items()},
        "probes": dict(Counter(r[0] for r in probe_rows)),
    }


def through_simulator(
    work: Workload,
    tmp: Path,
    probes: bool = False,
    declared_seats: bool = False,
    seed: int = 7,
    resuming: bool = False,
) -> dict[str, Any]:
    urls = {name: f"http://127.0.0.1:9/{name}" for name in OVERRIDES}  # never dialled
    path = tmp / "sim-policy.yaml"
    path.write_text(policy_text(urls, 1.0, probes, declared_seats, resuming))
    os.environ["FIDELITY_PAID_KEY"] = PAID_KEY
    simulation = Simulation(load_policy(path), work, PolicyRouter("fidelity"), seed=seed)
    result: RunResult = simulation.run()
    summary = summarize(result)
    summary["resumed"] = sum(outcome.resumed for outcome in result.outcomes)
    summary["probes"] = dict(simulation.prober.sent)
    summary["api_usd"] = sum(result.api_usd.values())
    return summary


def main() -> None:
    import tempfile

    if sys.argv[1:2] == ["--serve"]:
        with emulators(float(sys.argv[2]), [int(p) for p in sys.argv[3:6]]):
            while True:
                time.sleep(3600)

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    probes, with_spell = "--probes" in sys.argv, "--spell" in sys.argv
    declared, with_death = "--declared-seats" in sys.argv, "--death" in sys.argv
    duration = float(args[0]) if args else 120.0
    runs = int(args[1]) if len(args) > 1 else 1
    work = workload(duration, with_spell=with_spell, with_death=with_death)
    if runs > 1:  # the spread: the gateway run ``runs`` times, the simulator over as many seeds
        for side in ("gateway", "simulator"):
            for i in range(runs):
                with tempfile.TemporaryDirectory() as tmp:
                    if side == "gateway":
                        got = through_gateway(
                            work, Path(tmp), probes=probes, declared_seats=declared, resuming=with_death
                        )
                    else:
                        got = through_simulator(work, Path(tmp), probes, declared, 7 + i, with_death)
                share = got["share"].get("b300-vllm", 0.0)
                print(f"{side:>9} {i}: b300 share {share:.3f}  ttft p95 {got['ttft_p95_s']:.2f} s  "
                      f"total ${got['total_cost_usd']:.3f}  failures {got['failures']}  "
                      f"resumed {got['resumed']}", flush=True)  # fmt: skip
        return
    with tempfile.TemporaryDirectory() as tmp:
        real = through_gateway(work, Path(tmp), probes=probes, declared_seats=declared, resuming=with_death)
        sim = through_simulator(work, Path(tmp), probes, declared, resuming=with_death)
    keys = ("requests", "failures", "resumed", "api_usd", "total_cost_usd", "ttft_p95_s", "share", "probes")
    for key in keys:
        print(f"{key:>16}: gateway {real[key]!r:<60} simulator {sim[key]!r}")


if __name__ == "__main__":
    main()
