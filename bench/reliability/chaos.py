"""Scenario "chaos": a fleet meets its faults together, for a long time, and the books must balance.

Three ``gateway serve`` replicas share one Redis and one PostgreSQL ledger of the run's own, behind the
readiness-aware balancer (``balancer.py``); chat clients (short answers, streamed or not, some on a
route with a small daily budget) and agent clients (sessions of growing, tool-using conversations,
streamed) send through it, each request with its own ``x-request-id``. One fault at a time, at
random (each kind at least once): a replica SIGTERMed or SIGKILLed (then started again), PostgreSQL
or Redis restarted (Redis comes back empty), the GPU pool's emulator crashed (SIGKILL, started
again), a slow spell and a 429 burst on the pool, a policy reload.

Then the replicas stop (SIGTERM, their ledgers flush) and the run is judged: each client-visible
failure is expected (a fault that can cause it was under way) or not; each answered request has
exactly one ledger row (rows missing for requests a replica answered just before its SIGKILL are
counted apart: the writer's last flush interval); the ledger's spend equals the ``usage.cost`` the
clients were told, row by row within $0.000001; the budget's overspend; memory and fds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from bench.procs import Proc, start_redis
from bench.reliability.balancer import Balancer
from bench.reliability.client import (
    CUT_MID_STREAM,
    ERROR_EVENT,
    LOST,
    OK,
    REFUSED,
    Outcome,
    judge,
    new_client,
)
from bench.reliability.datastores import PrivatePostgres
from bench.reliability.process import free_port, open_fds, pss_bytes, start_emulator, start_gateway
from bench.reliability.row import Row, Settings
from gateway.runtime.stopping import STOP_MARGIN_S

GRACE_S = 10.0
CAP_USD = 0.02  # the "capped" route's daily budget: reached within the run, so it must hold
SHAPE = {"reasoning_tokens": 0, "content_tokens": 40}
FAULTS = ("sigterm", "sigkill", "postgres", "redis", "backend_crash", "slow_spell", "burst_429", "reload")
# Which faults can explain which client-visible failure (kind, or kind:code). Anything else is unexpected.
CAUSES: dict[str, tuple[str, ...]] = {
    LOST: ("sigkill",),
    CUT_MID_STREAM: ("sigkill",),
    f"{ERROR_EVENT}:gateway_shutting_down": ("sigterm",),
    ERROR_EVENT: ("backend_crash", "slow_spell", "burst_429", "sigkill"),
    f"{REFUSED}:gateway_shutting_down": ("sigterm",),
    REFUSED: ("backend_crash", "burst_429", "slow_spell"),
}
SLACK_S = 2.0  # a fault's window, widened: its effects reach clients a little before and after


@dataclass
class Asked:
    request_id: str
    route: str
    started: float
    ended: float = 0.0
    outcome: Outcome | None = None
    cost: float | None = None  # usage.cost as the client was told


@dataclass
class Fault:
    kind: str
    started: float
    ended: float = 0.0
    target: str = ""


@dataclass
class Replica:
    index: int
    port: int
    proc: Proc | None = None
    starts: int = 0

    @property
    def name(self) -> str:
        return f"replica-{self.index}"


@dataclass
class Fleet:
    out: Path
    policy: Path
    redis_port: int
    postgres: PrivatePostgres
    pool_port: int
    api_port: int
    replicas: list[Replica] = field(default_factory=list)
    redis: Proc | None = None
    pool: Proc | None = None
    api: Proc | None = None
    reloads: int = 0
    stops: list[dict[str, Any]] = field(default_factory=list)

    def gateway_args(self) -> tuple[str, ...]:
        return ("--redis-url", f"redis://127.0.0.1:{self.redis_port}", "--ledger", self.postgres.url,
                "--grace-s", f"{GRACE_S:g}")  # fmt: skip

    def start_replica(self, replica: Replica) -> None:
        replica.starts += 1  # each start its own log
        name = f"{replica.name}-start{replica.starts}"
        replica.proc = start_gateway(name, self.policy, replica.port, self.out, *self.gateway_args())

    def start_pool(self) -> None:
        self.pool = start_emulator("chaos-pool", "b300-vllm", self.pool_port, self.out, "--time-scale", "0.2")
        httpx.post(self.url(self.pool_port, "/emulator/faults"), json=SHAPE, timeout=10).raise_for_status()

    def url(self, port: int, path: str) -> str:
        return f"http://127.0.0.1:{port}{path}"

    def write_policy(self) -> None:
        self.policy.write_text(policy(self.pool_port, self.api_port, self.redis_port, self.reloads))


def policy(pool_port: int, api_port: int, redis_port: int, version: int) -> str:
    return f"""# version {version}
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:{pool_port}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    signals: {{health_url: http://127.0.0.1:{pool_port}/health}}
    timeouts: {{first_byte_s: 10, idle_s: 10}}
  api:
    dialect: openai
    url: http://127.0.0.1:{api_port}/v1
    model: kimi-k3
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {{first_byte_s: 10, idle_s: 10}}
routes:
  chat:
    backends: [pool, api]
  agent:
    backends: [pool, api]
  capped:
    backends: [api, pool]
    budgets: {{per_day_usd: {CAP_USD}}}
store: {{on_failure: fail_open, sync_interval_s: 0.5, key_prefix: 'chaos{redis_port}:'}}
ledger: {{flush_interval_s: 0.2}}
"""


# --- faults ---------------------------------------------------------------------------------------


def stop_replica(fleet: Fleet, replica: Replica, sig: int) -> None:
    proc = replica.proc
    assert proc is not None
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    bound = GRACE_S + STOP_MARGIN_S + 10.0
    try:
        code = proc.popen.wait(bound)
    except subprocess.TimeoutExpired:
        proc.stop()
        code = None
    fleet.stops.append({"replica": replica.name, "signal": signal.Signals(sig).name, "exit": code,
                        "stop_s": round(time.monotonic() - sent, 2)})  # fmt: skip
    fleet.start_replica(replica)


def apply_fault(fleet: Fleet, kind: str, rng: random.Random) -> str:
    """Create the fault (blocking: run in a thread); returns its target."""
    if kind in ("sigterm", "sigkill"):
        replica = rng.choice(fleet.replicas)
        stop_replica(fleet, replica, signal.SIGTERM if kind == "sigterm" else signal.SIGKILL)
        return replica.name
    if kind == "postgres":
        fleet.postgres.stop()
        time.sleep(3.0)
        fleet.postgres.start()
        return "postgres"
    if kind == "redis":
        assert fleet.redis is not None
        fleet.redis.stop()
        time.sleep(1.0)
        fleet.redis = start_redis("chaos-redis", fleet.redis_port, cpus="0-1", log_dir=fleet.out)
        return "redis"
    if kind == "backend_crash":
        assert fleet.pool is not None
        os.kill(fleet.pool.pid, signal.SIGKILL)
        fleet.pool.popen.wait(10)
        time.sleep(3.0)
        fleet.start_pool()
        return "pool"
    faults_url = fleet.url(fleet.pool_port, "/emulator/faults")
    if kind in ("slow_spell", "burst_429"):
        spell = {"slowdown": 6.0} if kind == "slow_spell" else {"error_rate": 1.0, "error_status": 429}
        httpx.post(faults_url, json=spell, timeout=10).raise_for_status()
        time.sleep(6.0)
        httpx.post(faults_url, json={"slowdown": 1.0, "error_rate": 0.0}, timeout=10).raise_for_status()
        return "pool"
    fleet.reloads += 1
    fleet.write_policy()
    time.sleep(2.0)
    return "policy"


async def inject(fleet: Fleet, faults: list[Fault], until: float, interval_s: float, seed: int,
                 say: Any) -> None:  # fmt: skip
    rng = random.Random(seed)
    order = list(FAULTS)
    rng.shuffle(order)  # each kind once, in a random order, then at random
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(0.5, 1.5) * interval_s)
        if time.monotonic() >= until:
            break
        kind = order.pop() if order else rng.choice(FAULTS)
        fault = Fault(kind, time.monotonic())
        say(f"chaos: {kind} at {time.strftime('%H:%M:%S')}")
        fault.target = await asyncio.to_thread(apply_fault, fleet, kind, rng)
        fault.ended = time.monotonic()
        faults.append(fault)


# --- traffic --------------------------------------------------------------------------------------

ids = itertools.count(1)


def told_cost(body: bytes, stream: bool) -> float | None:
    """The ``usage.cost`` in an answer, as a client reads it."""
    if not stream:
        try:
            cost = orjson.loads(body).get("usage", {}).get("cost")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return float(cost) if cost is not None else None
    found = None
    for event in body.split(b"\n\n"):
        event = event.strip()
        if event.startswith(b"data: {") and b'"usage"' in event:
            usage = orjson.loads(event[6:]).get("usage") or {}
            if "cost" in usage:
                found = float(usage["cost"])
    return found


Messages = list[dict[str, Any]]


async def send(client: httpx.AsyncClient, url: str, route: str, messages: Messages, stream: bool,
               asked: list[Asked], tools: Messages | None = None) -> bytes:  # fmt: skip
    request_id = f"chaos-{os.getpid()}-{next(ids):08d}"
    record = Asked(request_id, route, time.monotonic())
    asked.append(record)
    body: dict[str, Any] = {"model": route, "messages": messages, "max_tokens": 48, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
    data = b""
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"x-request-id": request_id}) as response:  # fmt: skip
            try:
                async for chunk in response.aiter_bytes():
                    data += chunk
                record.outcome = judge(response.status_code, None, stream, data)
            except httpx.HTTPError as exc:
                record.outcome = Outcome(CUT_MID_STREAM, response.status_code, detail=repr(exc))
    except httpx.HTTPError as exc:
        record.outcome = Outcome(LOST, detail=repr(exc))
    record.ended = time.monotonic()
    if record.outcome.kind == OK:
        record.cost = told_cost(data, stream)
    return data


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip


async def chat_client(n: int, url: str, asked: list[Asked], running: asyncio.Event) -> None:
    async with new_client(timeout_s=120) as client:
        for i in itertools.count():
            if not running.is_set():
                return
            route = "capped" if i % 10 == n % 10 else "chat"
            messages = [{"role": "user", "content": f"Say something short ({n}.{i})."}]
            await send(client, url, route, messages, stream=(i + n) % 2 == 0, asked=asked)


async def agent_client(n: int, url: str, asked: list[Asked], running: asyncio.Event) -> None:
    """Sessions of a few turns: the conversation grows with each answer and a tool result."""
    async with new_client(timeout_s=120) as client:
        for session in itertools.count():
            messages: list[dict[str, Any]] = [
                {
                    "role": "system",
                    "content": "You are a coding agent. " + "Follow the repository rules. " * 40,
                },
                {"role": "user", "content": f"Fix the failing test in session {n}.{session}."},
            ]
            for turn in range(5):
                if not running.is_set():
                    return
                data = await send(client, url, "agent", messages, True, asked, TOOLS)
                messages.append({"role": "assistant", "content": f"(turn {turn}: {len(data)} bytes)"})
                messages.append({"role": "user", "content": f"The tool said: {'ok ' * (20 * (turn + 1))}"})


# --- the run --------------------------------------------------------------------------------------


def run(settings: Settings) -> list[Row]:
    duration_s = settings.duration_s or (120.0 if settings.short else 1800.0)
    interval_s = 10.0 if settings.short else 45.0
    out = settings.out_dir / "chaos"
    out.mkdir(parents=True, exist_ok=True)
    row = Row("chaos")
    postgres = PrivatePostgres(free_port()).init()
    postgres.start()
    fleet = Fleet(out, out / "policy.yaml", free_port(), postgres, free_port(), free_port())
    fleet.replicas = [Replica(i, free_port()) for i in range(3)]
    try:
        fleet.redis = start_redis("chaos-redis", fleet.redis_port, cpus="0-1", log_dir=out)
        fleet.start_pool()
        fleet.api = start_emulator("chaos-api", "paid-api", fleet.api_port, out, "--time-scale", "0.2")
        fleet.write_policy()
        for replica in fleet.replicas:
            fleet.start_replica(replica)
        asked, faults, resources = asyncio.run(drive(fleet, settings, duration_s, interval_s, row))
        for replica in fleet.replicas:
            assert replica.proc is not None
            replica.proc.stop(timeout_s=GRACE_S + STOP_MARGIN_S + 10)  # SIGTERM: each flushes its ledger
        row.details["stops"] = fleet.stops
        row.details["policy_reloads"] = fleet.reloads
        judge_run(row, asked, faults, ledger_of(postgres.url), resources)
    finally:
        for proc in [*(r.proc for r in fleet.replicas), fleet.pool, fleet.api, fleet.redis]:
            if proc is not None:
                proc.stop()
        postgres.remove()
    return [row]


async def drive(fleet: Fleet, settings: Settings, duration_s: float, interval_s: float,
                row: Row) -> tuple[list[Asked], list[Fault], dict[str, Any]]:  # fmt: skip
    balancer = Balancer([r.port for r in fleet.replicas])
    await balancer.start()
    asked: list[Asked] = []
    faults: list[Fault] = []
    running = asyncio.Event()
    running.set()
    try:
        for replica in fleet.replicas:
            if not await balancer.wait_ready(replica.port):
                row.problems.append(f"{replica.name} never became ready")
        clients = [chat_client(n, balancer.url, asked, running) for n in range(4)]
        clients += [agent_client(n, balancer.url, asked, running) for n in range(2)]
        tasks = [asyncio.create_task(c) for c in clients]
        await asyncio.sleep(5.0)  # warm-up
        start = resources_of(fleet)
        until = time.monotonic() + duration_s
        await inject(fleet, faults, until, interval_s, settings.seed, settings.say)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        running.clear()
        await asyncio.gather(*tasks)
        for replica in fleet.replicas:  # the end's figures once every replica is back in
            await balancer.wait_ready(replica.port)
        await asyncio.sleep(2.0)
        end = resources_of(fleet)
    finally:
        running.clear()
        await balancer.stop()
    row.details["balancer"] = {"connections": balancer.counts.connections,
                               "unplaced": balancer.counts.unplaced}  # fmt: skip
    return asked, faults, {"start": start, "end": end}


def resources_of(fleet: Fleet) -> dict[str, int]:
    pids = [r.proc.pid for r in fleet.replicas if r.proc is not None]
    return {"pss_bytes": sum(pss_bytes(p) for p in pids), "fds": sum(open_fds(p) for p in pids)}


def ledger_of(url: str) -> list[tuple[str, str, str, float]]:
    with psycopg.connect(url, connect_timeout=10) as db:
        query = "SELECT request_id, route, status, cost_usd FROM requests"
        return [(r[0], r[1], r[2], float(r[3] or 0.0)) for r in db.execute(query).fetchall()]


def clock(monotonic: float) -> str:
    """A monotonic instant as the wall clock's time of day, to read against the replicas' logs."""
    return time.strftime("%H:%M:%S", time.localtime(time.time() - time.monotonic() + monotonic))


def nearest(asked: Asked, faults: list[Fault]) -> str:
    if not faults:
        return "none"
    fault = min(faults, key=lambda f: min(abs(asked.ended - f.started), abs(asked.ended - f.ended)))
    return f"{fault.kind} {fault.target} {clock(fault.started)}-{clock(fault.ended)}"


def by_kind(asked: list[Asked]) -> dict[str, int]:
    return dict(Counter(f"{a.outcome.kind}:{a.outcome.code}" for a in asked if a.outcome is not None))


def cause_of(outcome: Outcome) -> tuple[str, ...]:
    return CAUSES.get(f"{outcome.kind}:{outcome.code}", CAUSES.get(outcome.kind, ()))


def judge_run(row: Row, asked: list[Asked], faults: list[Fault], ledger: list[tuple[str, str, str, float]],
              resources: dict[str, Any]) -> None:  # fmt: skip
    row.requests = len(asked)
    answered = [a for a in asked if a.outcome is not None and a.outcome.kind == OK]
    budget_refused = [a for a in asked if a.outcome is not None and a.outcome.code == "budget_exhausted"]
    failed = [a for a in asked if a.outcome is not None and a.outcome.kind != OK and a not in budget_refused]
    expected, unexpected = [], []
    for a in failed:
        assert a.outcome is not None
        kinds = cause_of(a.outcome)
        under = [f for f in faults if f.kind in kinds and f.started - SLACK_S <= a.ended
                 and a.started <= f.ended + SLACK_S]  # fmt: skip
        (expected if under else unexpected).append(a)
    row.client_visible_failures = len(failed)
    row.expected_failures = len(expected)

    rows_by_id: dict[str, list[tuple[str, str, str, float]]] = {}
    for entry in ledger:
        rows_by_id.setdefault(entry[0], []).append(entry)
    kills = [f for f in faults if f.kind == "sigkill"]
    missing = [a for a in answered if a.request_id not in rows_by_id]
    missing_at_kill = [
        a for a in missing if any(k.started - 1.0 <= a.ended <= k.started + 0.1 for k in kills)
    ]
    duplicated = [a for a in answered if len(rows_by_id.get(a.request_id, ())) > 1]
    priced = [
        (a, rows_by_id[a.request_id][0]) for a in answered if len(rows_by_id.get(a.request_id, ())) == 1
    ]
    unknown_cost = [a for a, _ in priced if a.cost is None]
    off = [(a, r) for a, r in priced if a.cost is not None and abs(a.cost - r[3]) > 1e-6]
    ledger_spend = sum(r[3] for _, r in priced)
    told_spend = sum(a.cost or 0.0 for a, _ in priced)
    capped_spend = sum(e[3] for e in ledger if e[1] == "capped" and e[2] == "ok")
    row.memory_before_bytes = resources["start"]["pss_bytes"]
    row.memory_after_bytes = resources["end"]["pss_bytes"]
    row.details.update({
        "answered": len(answered),
        "refused_by_budget": len(budget_refused),
        "faults": dict(Counter(f.kind for f in faults)),
        "failures_expected": by_kind(expected),
        "failures_unexpected": by_kind(unexpected),
        "unexpected_examples": [f"{a.request_id} {a.route} {a.outcome.status} {a.outcome.detail[:120]} "
                                f"(ended {clock(a.ended)}; nearest fault: {nearest(a, faults)})"
                                for a in unexpected[:5] if a.outcome],
        "fault_log": [f"{clock(f.started)}-{clock(f.ended)} {f.kind} {f.target}" for f in faults],
        "ledger_rows": len(ledger),
        "ledger_rows_missing": len(missing) - len(missing_at_kill),
        "ledger_rows_missing_at_sigkill": len(missing_at_kill),
        "ledger_rows_duplicated": len(duplicated),
        "spend_ledger_usd": round(ledger_spend, 9),
        "spend_told_usd": round(told_spend, 9),
        "rows_off_by_more_than_1e-6": len(off),
        "answers_without_usage_cost": len(unknown_cost),
        "budget_cap_usd": CAP_USD,
        "budget_overspend_usd": round(max(0.0, capped_spend - CAP_USD), 9),
        "memory_pss_bytes": [resources["start"]["pss_bytes"], resources["end"]["pss_bytes"]],
        "fds": [resources["start"]["fds"], resources["end"]["fds"]],
    })  # fmt: skip
    if unexpected:
        row.problems.append(f"{len(unexpected)} unexpected client-visible failures: "
                            f"{row.details['failures_unexpected']}")  # fmt: skip
    if missing_at_kill != missing:
        row.problems.append(f"{len(missing) - len(missing_at_kill)} answered requests have no ledger row")
    if duplicated:
        row.problems.append(f"{len(duplicated)} answered requests have more than one ledger row")
    if off:
        a, r = off[0]
        row.problems.append(
            f"{len(off)} rows differ from the cost the client was told (first: {a.cost} vs {r[3]})"
        )
    if any(stop["exit"] is None for stop in row.details.get("stops", [])):
        row.problems.append("a replica did not stop within its bound")
