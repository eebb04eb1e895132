"""Scenario "faults": the fault matrix's eleven upstream faults at once, each on the first backend of a
route of its own, mixed with healthy traffic, through a real ``gateway serve`` process. Before the first
byte the gateway must fall back (a client-visible failure there is not expected); after it, the stream
ends with an error event (expected). Then: a ledger row per request, each failed attempt counted in the
metrics by its type, and the process holds no more descriptors, sockets, in-flight attempts or budget
reservations than after warm-up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.reliability.client import ERROR_EVENT, OK, Outcome, ask, new_client, tally
from bench.reliability.faulty_upstream import FaultyUpstream, faulty_upstream
from bench.reliability.holdings import holdings, leaks, ledger_rows, ledger_summary, metric_total, settled
from bench.reliability.process import free_port, start_emulator, start_gateway
from bench.reliability.row import Row, Settings

FALLBACK, MID_STREAM = "fallback", "error event"


@dataclass(frozen=True)
class Fault:
    name: str
    mode: str  # the faulty upstream's mode, or "refused" (nothing listens)
    stream: bool
    client_sees: str  # FALLBACK or MID_STREAM
    error_type: str  # the metric's type label for the failed attempt


FAULTS = [
    Fault("upstream 500", "http_500", False, FALLBACK, "http_5xx"),
    Fault("429 with Retry-After", "http_429", True, FALLBACK, "http_429"),
    Fault("connection refused", "refused", True, FALLBACK, "upstream_error"),
    Fault("connection reset", "reset", False, FALLBACK, "upstream_error"),
    Fault("hang before the first byte", "hang_before_first_byte", True, FALLBACK, "timeout"),
    Fault("hang mid-stream", "hang_mid_stream", True, MID_STREAM, "timeout"),
    Fault("death mid-stream", "death_mid_stream", True, MID_STREAM, "dropped"),
    Fault("garbage bytes in the SSE stream", "garbage_sse", True, MID_STREAM, "dropped"),
    Fault("truncated JSON answer", "truncated_json", False, FALLBACK, "upstream_error"),
    Fault("one byte per second", "trickle", True, FALLBACK, "timeout"),
    Fault("200 with an OpenAI error body", "ok_with_error_body", False, FALLBACK, "upstream_error"),
]


def backend_of(fault: Fault) -> str:
    return "f-" + fault.mode.replace("_", "-")


def policy(raw: FaultyUpstream, good_url: str) -> str:
    backends, routes = [], []
    for fault in FAULTS:
        url = f"http://127.0.0.1:{free_port()}" if fault.mode == "refused" else raw.url_for(fault.mode)
        backends.append(f"""  {backend_of(fault)}:
    dialect: vllm
    url: {url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 0.01, output_usd_per_mtok: 0.01}}}}
    timeouts: {{connect_s: 2, first_byte_s: 1.5, idle_s: 1.5, answer_s: 5}}""")
        routes.append(f"""  {backend_of(fault)}:
    backends: [{backend_of(fault)}, good]
    # Once "good" is measured it ranks first (the unmeasured come after): exploring sends about half
    # of the rest to the faulty backend, so each fault is met again and again among healthy traffic.
    exploration: 0.5
    fallback: {{resume_streams: false}}  # a cut stream must show its error event (the soak resumes them)
    budgets: {{per_day_usd: 1000}}""")
    backend_text, route_text = "\n".join(backends), "\n".join(routes)
    return f"""
backends:
{backend_text}
  good:
    dialect: vllm
    url: {good_url}/v1
    model: moonshotai/Kimi-K3
    # Dearer per token than every faulty backend, whatever is measured: each request meets its fault first.
    pricing: {{per_token: {{input_usd_per_mtok: 10, output_usd_per_mtok: 100}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
{route_text}
  healthy:
    backends: [good]
    budgets: {{per_day_usd: 1000}}
ledger: {{flush_interval_s: 0.05}}
tuning:
  # Every request meets its fault: a circuit that opened would send the rest straight to "good".
  circuit: {{failure_threshold: 1000, base_cooldown_s: 1, max_cooldown_s: 1}}
  probes: {{enabled: false}}  # users meet the faults, not probes
"""


async def run_requests(url: str, plan: list[tuple[str, bool]], concurrency: int) -> list[Outcome]:
    outcomes: list[Outcome | None] = [None] * len(plan)
    queue = iter(range(len(plan)))
    async with new_client(timeout_s=120) as client:

        async def worker() -> None:
            for i in queue:
                route, stream = plan[i]
                outcomes[i] = await ask(client, url, route, stream)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [o for o in outcomes if o is not None]


def expected(fault: Fault, outcome: Outcome) -> bool:
    """What a client of this fault's route may see: a whole answer from "good" (straight there, or a
    fallback), or for a fault after the first byte, the faulty backend's stream ending in an error event."""
    if outcome.kind == OK:
        return outcome.backend == "good"
    return (
        fault.client_sees == MID_STREAM
        and outcome.kind == ERROR_EVENT
        and outcome.backend == backend_of(fault)
    )


def run(settings: Settings) -> list[Row]:
    # Exploring sends each request to its faulty backend with probability 1/2: with 16 each fault goes
    # unmet once in 65,000 tries (with 6, one short run in ten missed one of the eleven).
    per_fault, healthy = (16, 40) if settings.short else (40, 600)
    rng = random.Random(settings.seed)
    out = settings.out_dir / "faults"
    out.mkdir(parents=True, exist_ok=True)
    ledger = out / "faults-gateway-ledger.sqlite3"
    ledger.unlink(missing_ok=True)  # one run's rows only
    row = Row("faults")
    with faulty_upstream() as raw:
        good_port, gateway_port = free_port(), free_port()
        good = start_emulator("faults-good", "b300-vllm", good_port, out, "--time-scale", "0.01")
        gateway = None
        try:
            path = out / "policy.yaml"
            path.write_text(policy(raw, f"http://127.0.0.1:{good_port}"))
            gateway = start_gateway("faults-gateway", path, gateway_port, out)
            url = f"http://127.0.0.1:{gateway_port}"
            # Each fault once, on a fresh gateway (its first request meets it), then healthy traffic.
            warm = [(backend_of(f), f.stream) for f in FAULTS] + [("healthy", i % 2 == 0) for i in range(20)]
            settings.say(f"faults: warm-up, {len(warm)} requests")
            outcomes = asyncio.run(run_requests(url, warm, concurrency=8))
            baseline = settled(gateway, url, holdings(gateway, url), timeout_s=5)
            plan = [(backend_of(f), f.stream) for f in FAULTS for _ in range(per_fault)]
            plan += [("healthy", i % 2 == 0) for i in range(healthy)]
            rng.shuffle(plan)
            settings.say(f"faults: {len(plan)} requests, {per_fault} per fault, {healthy} healthy")
            outcomes += asyncio.run(run_requests(url, plan, concurrency=8))
            end = settled(gateway, url, baseline)
            row.memory_before_bytes, row.memory_after_bytes = baseline.pss_bytes, end.pss_bytes
            row.leaks = leaks(baseline, end)
            check_client(row, warm + plan, outcomes)
            counted = counted_failures(row, url)
            gateway.stop(timeout_s=60)  # SIGTERM: the ledger is flushed before the exit
            check_ledger(row, ledger, counted)
        finally:
            if gateway is not None:
                gateway.stop()
            good.stop()
    return [row]


def check_client(row: Row, plan: list[tuple[str, bool]], outcomes: list[Outcome]) -> None:
    faults = {backend_of(f): f for f in FAULTS}
    row.requests = len(outcomes)
    row.details["outcomes"] = tally(outcomes)
    unexpected: dict[str, int] = {}
    for (route, _), outcome in zip(plan, outcomes, strict=True):
        fault = faults.get(route)
        row.client_visible_failures += outcome.kind != OK
        if outcome.kind == ERROR_EVENT and fault is not None and expected(fault, outcome):
            row.expected_failures += 1  # cut after its first byte: nothing could save it
        elif not (outcome.kind == OK if fault is None else expected(fault, outcome)):
            key = f"{route}: {outcome.kind} {outcome.status or ''} {outcome.code or ''}".strip()
            unexpected[key] = unexpected.get(key, 0) + 1
    if unexpected:
        row.problems.append(f"unexpected client views: {unexpected}")


def counted_failures(row: Row, url: str) -> dict[str, float]:
    """Each faulty backend's failed attempts (of any type), as /metrics counts them; and the
    circuits: the healthy backend's must still be closed."""
    circuits = {
        b["backend"]: b["circuit"] for b in httpx.get(url + "/dashboard/data", timeout=30).json()["backends"]
    }
    row.details["circuits"] = circuits
    if circuits.get("good") != "closed":
        row.problems.append(f"the healthy backend's circuit is {circuits.get('good')}")
    # Every type: on a busy machine a trickle can end as a timeout or as a cut, and both are failures.
    return {
        backend_of(f): metric_total(url, "gateway_upstream_errors_total", backend=backend_of(f))
        for f in FAULTS
    }


def check_ledger(row: Row, path: Path, counted: dict[str, float]) -> None:
    """A row per request, and the same failed attempts in the rows' attempt logs as in the metrics,
    every fault met at least once."""
    rows = ledger_rows(path)
    if rows != row.requests:
        row.problems.append(f"ledger has {rows} rows for {row.requests} requests")
    row.details["ledger"] = ledger_summary(path)
    logged = {name: 0 for name in counted}
    with contextlib.closing(sqlite3.connect(path)) as db:
        for (log,) in db.execute("SELECT attempt_log FROM requests"):
            for attempt in json.loads(log or "[]"):
                if attempt["backend"] in logged and attempt["status"] != "ok":
                    logged[attempt["backend"]] += 1
    row.details["fault_attempts"] = logged
    for name, failed in logged.items():
        if failed < 1:
            row.problems.append(f"{name}: its fault was never met")
        if counted[name] != failed:
            row.problems.append(
                f"{name}: the ledger logs {failed} failed attempts, /metrics counts {counted[name]:g}"
            )
