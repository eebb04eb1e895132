"""Scenario "soak": a long run of mixed streaming and whole answers through a real ``gateway serve``
process in front of two emulated pools, with faults injected on the first in turn (500s it falls back
from, streams that die mid-way, a rate limit), through the emulator's fault knobs. It must end where it
began: PSS at the end within 10% of after warm-up, no more descriptors or sockets, nothing in flight
or reserved, and after the SIGTERM flush, one ledger row per request. The long documented run is
``--only soak --requests 100000``."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from bench.reliability.client import ERROR_EVENT, OK, Outcome, ask, new_client, tally
from bench.reliability.holdings import holdings, leaks, ledger_rows, ledger_summary, settled
from bench.reliability.process import free_port, start_emulator, start_gateway
from bench.reliability.row import Row, Settings

SHORT_REQUESTS, LONG_REQUESTS = 3_000, 30_000
WARM_UP_SHARE = 0.1  # the first tenth settles caches and pools; memory is judged against its end
MIN_WARM_UP = 1_000  # a short run's tenth is too few to fill the live stats' windows
MEMORY_GROWTH_LIMIT = 0.10
CONCURRENCY = 16
SHAPE = {"reasoning_tokens": 4, "content_tokens": 12}  # short answers: the run measures the gateway
# The faults injected on the pool, one phase each in turn (a clean phase between each).
# Each on the pool only: the spare takes over before a byte, or resumes a stream cut mid-way (a stream
# it cannot resume ends with an error event: the one failure a client cannot be spared).
PHASES: list[tuple[str, dict[str, Any]]] = [
    ("clean", {}),
    ("500s", {"error_rate": 0.3, "error_status": 500}),
    ("clean", {}),
    ("deaths mid-stream", {"drop_after_chunks": 6}),
    ("clean", {}),
    ("rate limited", {"rate_limit_rpm": 600}),
]


def policy(pool_url: str, spare_url: str) -> str:
    return f"""
backends:
  pool:  # half the spare's hourly price: the first choice whenever it is up, so it meets the faults
    dialect: vllm
    url: {pool_url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 31.5}}}}
    timeouts: {{first_byte_s: 10, idle_s: 5, answer_s: 30}}
  spare:
    dialect: vllm
    url: {spare_url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    timeouts: {{first_byte_s: 10, idle_s: 5, answer_s: 30}}
routes:
  soak:
    backends: [pool, spare]
    budgets: {{per_day_usd: 100000}}
ledger: {{flush_interval_s: 0.2}}
"""


def set_faults(url: str, knobs: dict[str, Any]) -> None:
    httpx.delete(url + "/emulator/faults", timeout=10).raise_for_status()
    httpx.post(url + "/emulator/faults", json={**SHAPE, **knobs}, timeout=10).raise_for_status()


async def load(url: str, count: int, start: int, phase_of: Any) -> list[Outcome]:
    """``count`` requests, every other one streamed; ``phase_of(i)`` turns the knobs when a phase begins."""
    outcomes: list[Outcome] = []
    numbers = iter(range(start, start + count))
    async with new_client(timeout_s=120) as client:

        async def worker() -> None:
            for i in numbers:
                await phase_of(i)
                outcomes.append(await ask(client, url, "soak", stream=i % 2 == 0))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return outcomes


def run(settings: Settings) -> list[Row]:
    total = settings.requests or (SHORT_REQUESTS if settings.short else LONG_REQUESTS)
    warm = min(total // 2, max(MIN_WARM_UP, int(total * WARM_UP_SHARE)))
    out = settings.out_dir / "soak"
    out.mkdir(parents=True, exist_ok=True)
    row = Row("soak")
    ledger = out / "soak-gateway-ledger.sqlite3"
    ledger.unlink(missing_ok=True)  # one run's rows only
    pool_port, spare_port, gateway_port = free_port(), free_port(), free_port()
    pool = start_emulator("soak-pool", "b300-vllm", pool_port, out, "--time-scale", "0.01")
    spare = start_emulator("soak-spare", "b300-vllm", spare_port, out, "--time-scale", "0.01")
    gateway = None
    pools = [f"http://127.0.0.1:{pool_port}", f"http://127.0.0.1:{spare_port}"]  # the faults' order
    try:
        for pool_url in pools:
            set_faults(pool_url, {})
        path = out / "policy.yaml"
        path.write_text(policy(*pools))
        gateway = start_gateway("soak-gateway", path, gateway_port, out)
        url = f"http://127.0.0.1:{gateway_port}"
        settings.say(f"soak: warm-up, {warm} requests")
        outcomes = asyncio.run(load(url, warm, 0, phase_turner(pools, 0, warm)))
        baseline = settled(gateway, url, holdings(gateway, url), timeout_s=10)
        main = total - warm
        block = max(1, main // (2 * len(PHASES)))  # every phase twice
        settings.say(
            f"soak: {main} requests, faults in phases of {block} ({', '.join(p for p, _ in PHASES)})"
        )
        started = time.monotonic()
        turner = phase_turner(pools, warm, block, say=settings.say, total=total)
        outcomes += asyncio.run(load(url, main, warm, turner))
        wall = time.monotonic() - started
        for pool_url in pools:
            set_faults(pool_url, {})
        end = settled(gateway, url, baseline)
        row.details["requests_per_s"] = round(main / wall, 1)
        row.memory_before_bytes, row.memory_after_bytes = baseline.pss_bytes, end.pss_bytes
        row.details["fds"], row.details["sockets"] = (baseline.fds, end.fds), (baseline.sockets, end.sockets)
        row.leaks = leaks(baseline, end)
        gateway.stop(timeout_s=60)  # SIGTERM: the ledger is flushed before the exit
        judge(row, outcomes, ledger_rows(ledger))
        row.details["ledger"] = ledger_summary(ledger)
        row.details["taken_over"] = taken_over = requests_taken_over(ledger)
        if not taken_over:
            row.problems.append("no request needed a second attempt: the faults never reached the gateway")
    finally:
        if gateway is not None:
            gateway.stop()
        pool.stop()
        spare.stop()
    return [row]


def phase_turner(pools: list[str], start: int, block: int, *, say: Any = None, total: int = 0) -> Any:
    """An async callable that sets the pools' knobs when request ``i`` opens a new phase."""
    state = {"phase": -1}
    lock = asyncio.Lock()

    async def turn(i: int) -> None:
        phase = (i - start) // block
        if phase <= state["phase"]:
            return
        async with lock:
            if phase <= state["phase"]:
                return
            state["phase"] = phase
            name, knobs = PHASES[phase % len(PHASES)]
            await asyncio.to_thread(set_faults, pools[0], knobs)
            if say is not None:
                say(f"soak: request {i}/{total}: {name}")

    return turn


def judge(row: Row, outcomes: list[Outcome], rows: int) -> None:
    row.requests = len(outcomes)
    row.details["outcomes"] = tally(outcomes)
    row.client_visible_failures = sum(o.kind != OK for o in outcomes)
    # A stream whose pool died mid-way, and that no other pool could continue, ends with an error event:
    # unavoidable once its first bytes were out. Anything else a client sees is a failure of the gateway.
    row.expected_failures = sum(o.kind == ERROR_EVENT for o in outcomes)
    unexpected = [o for o in outcomes if o.kind not in (OK, ERROR_EVENT)]
    if unexpected:
        kinds = tally(unexpected)
        row.problems.append(f"{len(unexpected)} unexpected client-visible failures: {kinds}; "
                            f"first: {unexpected[0].detail[:160]}")  # fmt: skip
    growth = (row.memory_after_bytes or 0) / max(1, row.memory_before_bytes or 1) - 1
    row.details["memory_growth"] = round(growth, 3)
    if growth > MEMORY_GROWTH_LIMIT:
        row.problems.append(f"PSS grew {growth:.0%} after warm-up (limit {MEMORY_GROWTH_LIMIT:.0%})")
    if rows != row.requests:
        row.problems.append(f"ledger has {rows} rows for {row.requests} requests")


def requests_taken_over(path: Path) -> int:
    """Requests a second attempt finished (a fallback before the first byte, or a resumed stream)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT count(*) FROM requests WHERE attempts > 1").fetchone()[0])
