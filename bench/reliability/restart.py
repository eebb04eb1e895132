"""Scenario "restart": a rolling restart under steady mixed load. Three ``gateway serve`` replicas share
one Redis behind a small load balancer (``balancer.py``: readiness-aware, retries a refused connection
elsewhere, as a Kubernetes Service does); each replica in turn is SIGTERMed with requests in flight,
must stop within its grace, and is started again. No request may be lost before its first byte, those
mid-stream at SIGTERM finish within the grace (none cut), and after the last SIGTERM flush the three
ledgers hold one row per request. A replica that does not stop in time fails the row, naming it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bench.procs import Proc, start_redis
from bench.reliability.balancer import Balancer
from bench.reliability.client import CUT_MID_STREAM, ERROR_EVENT, OK, Outcome, ask, new_client, tally
from bench.reliability.holdings import ledger_rows, metric
from bench.reliability.process import free_port, start_emulator, start_gateway
from bench.reliability.row import Row, Settings

GRACE_S = 20.0  # streams here last about two seconds: every one open at SIGTERM finishes well within it
STOP_BOUND_S = GRACE_S + 30.0  # past this a replica "did not stop": a failure of the row, not a hang
SHAPE = {"reasoning_tokens": 20, "content_tokens": 150}  # at time scale 0.5: ~0.5 s TTFT, ~1 s of tokens


@dataclass
class Replica:
    index: int
    port: int
    proc: Proc | None = None
    stops: list[dict[str, float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def policy(pool_url: str) -> str:
    return f"""
backends:
  pool:
    dialect: vllm
    url: {pool_url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
  kimi-k3:
    backends: [pool]
    budgets: {{per_day_usd: 100000}}
ledger: {{flush_interval_s: 0.2}}
"""


def inflight(replica: Replica) -> int:
    """Attempts in flight at this replica alone (the dashboard's figure is the fleet's, through Redis)."""
    try:
        return int(metric(replica.url, "gateway_backend_inflight_requests", backend="pool"))
    except httpx.HTTPError:
        return -1


def stop_replica(replica: Replica, row: Row) -> None:
    """SIGTERM by pid, as the kubelet does; the replica must exit within the bound."""
    proc = replica.proc
    assert proc is not None
    before = inflight(replica)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.popen.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        row.problems.append(f"{replica.name} did not stop within {STOP_BOUND_S:.0f} s of SIGTERM "
                            f"({before} in flight); killed:\n{proc.log_tail(8)}")  # fmt: skip
        proc.stop()
        code = -1
    replica.stops.append(
        {"inflight_at_sigterm": before, "stop_s": round(time.monotonic() - sent, 2), "exit": code}
    )
    if code != 0:
        row.problems.append(f"{replica.name} exited with {code} after SIGTERM")


def run(settings: Settings) -> list[Row]:
    workers, rounds = (6, 1) if settings.short else (16, 3)
    out = settings.out_dir / "restart"
    out.mkdir(parents=True, exist_ok=True)
    row = Row("restart")
    replicas = [Replica(i, free_port()) for i in range(3)]
    for replica in replicas:
        (out / f"{replica.name}-ledger.sqlite3").unlink(missing_ok=True)
    redis_port, pool_port = free_port(), free_port()
    redis = start_redis("restart-redis", redis_port, cpus="0-1", log_dir=out, timeout_s=30.0)
    pool = start_emulator("restart-pool", "b300-vllm", pool_port, out, "--time-scale", "0.5")
    try:
        httpx.post(f"http://127.0.0.1:{pool_port}/emulator/faults", json=SHAPE, timeout=10).raise_for_status()
        path = out / "policy.yaml"
        path.write_text(policy(f"http://127.0.0.1:{pool_port}"))
        extra = ("--redis-url", f"redis://127.0.0.1:{redis_port}", "--grace-s", f"{GRACE_S:g}")
        for replica in replicas:
            replica.proc = start_gateway(replica.name, path, replica.port, out, *extra)
        outcomes = asyncio.run(roll(settings, replicas, row, workers, rounds, lambda r: start_gateway(
            r.name, path, r.port, out, *extra)))  # fmt: skip
        for replica in replicas:
            assert replica.proc is not None
            replica.proc.stop(timeout_s=STOP_BOUND_S)  # SIGTERM: each flushes its ledger
        judge(row, outcomes, sum(ledger_rows(out / f"{r.name}-ledger.sqlite3") for r in replicas))
        row.details["stops"] = {r.name: r.stops for r in replicas}
    finally:
        for replica in replicas:
            if replica.proc is not None:
                replica.proc.stop()
        pool.stop()
        redis.stop()
    return [row]


async def roll(settings: Settings, replicas: list[Replica], row: Row, workers: int, rounds: int,
               restart: Callable[[Replica], Proc]) -> list[Outcome]:  # fmt: skip
    """Steady load through the balancer while each replica in turn is stopped and started again."""
    balancer = Balancer([r.port for r in replicas])
    await balancer.start()
    outcomes: list[Outcome] = []
    running = True
    async with new_client(timeout_s=120) as client:

        async def worker(n: int) -> None:
            i = n
            while running:
                outcomes.append(await ask(client, balancer.url, "kimi-k3", stream=i % 2 == 0))
                i += 1

        try:
            for replica in replicas:
                if not await balancer.wait_ready(replica.port):
                    row.problems.append(f"{replica.name} never became ready")
            tasks = [asyncio.create_task(worker(n)) for n in range(workers)]
            await asyncio.sleep(3.0)  # steady load first
            for turn in range(rounds):
                for replica in replicas:
                    settings.say(f"restart: round {turn + 1}/{rounds}: SIGTERM {replica.name} "
                                 f"({len(outcomes)} requests so far)")  # fmt: skip
                    await asyncio.to_thread(stop_replica, replica, row)
                    replica.proc = await asyncio.to_thread(restart, replica)
                    if not await balancer.wait_ready(replica.port):
                        row.problems.append(f"{replica.name} was not ready again after its restart")
                    await asyncio.sleep(2.0)  # load on the full set again before the next one
            running = False
            await asyncio.gather(*tasks)
        finally:
            running = False
            await balancer.stop()
    row.details["balancer"] = {
        "connections": balancer.counts.connections,
        "refused_and_retried": balancer.counts.retried,
        "unplaced": balancer.counts.unplaced,
    }
    return outcomes


def judge(row: Row, outcomes: list[Outcome], rows: int) -> None:
    row.requests = len(outcomes)
    row.details["outcomes"] = tally(outcomes)
    lost = [o for o in outcomes if not o.began]  # refused, lost, or a 200 that was no answer
    cut = [o for o in outcomes if o.kind in (ERROR_EVENT, CUT_MID_STREAM)]
    row.client_visible_failures = sum(o.kind != OK for o in outcomes)
    row.expected_failures = 0  # every stream open at SIGTERM fits in the grace: none may be cut
    row.details["lost_before_first_byte"], row.details["cut_mid_stream"] = len(lost), len(cut)
    if lost:
        row.problems.append(f"{len(lost)} requests lost before their first byte: {tally(lost)}; "
                            f"first: {lost[0].status} {lost[0].detail[:160]}")  # fmt: skip
    if cut:
        row.problems.append(
            f"{len(cut)} streams cut mid-way though the grace covered them; first: {cut[0].detail[:160]}"
        )
    if rows != row.requests:
        row.problems.append(f"the ledgers have {rows} rows for {row.requests} requests")
