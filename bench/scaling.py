"""``gateway serve --workers N`` measured: ``python -m bench.scaling [--workers 2] [--quick] [--out DIR]``.

Two parts, against the bench upstream and a redis-server of this run's own (no persistence):

1. Throughput per added core: the gateway with ``--workers 1`` and then ``--workers N``, both with
   ``--redis-url``, its process tree pinned to the first 1 or N cores (its workers inherit the
   affinity), the load generator on the next core and the upstream with Redis on the one after.
   Non-streamed and streamed req/s at saturation and the paced streams held, per worker count, and
   the ratio N/1. That needs N + 2 cores: with fewer the workers, the load generator and the upstream
   would share cores and the ratio would measure the sharing, so it is not measured (``--force`` runs
   it anyway, labelled as no scaling figure).
2. Shared state under N workers, on any machine and at light load: an API key's requests per minute
   and a route's daily budget must hold fleet-wide, whichever worker each request reaches. Each
   request has a connection of its own, which the kernel hands to some worker; /ready on it says
   which, the requests go out spread evenly over the workers (so none reaches the limit alone), and
   the ledger's ``replica`` column must agree on who served what.

Writes DIR/scaling.json and DIR/scaling.md; exits 1 when the shared-state check fails, 2 without
redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import socket
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httptools
import orjson

from bench import report, servers
from bench.loadgen import closed_loop
from bench.procs import Proc, core_busy_s, pin_self, start, start_redis
from bench.run import Progress, loadavg, machine
from bench.suite import Settings, Way, latency_summary, paced, wait_ready
from gateway.values.auth import digest_of, new_key

RESULTS = servers.BENCH / "results"
GOAL = "two workers >= 1.7x one worker's throughput"
GOAL_FACTOR = 1.7
SHARED_LABEL = "shared cores: not a scaling figure"
# The shared-state check: an API key allowed RATE_LIMIT requests a minute, and a route whose daily
# budget admits BUDGET_REQUESTS requests of REQUEST_USD each (8 output tokens at $1000 per 1M tokens,
# input free, max_tokens 8: what admission reserves is exactly what the ledger then charges).
RATE_LIMIT = 30
RATE_EXTRA = 15
BUDGET_REQUESTS = 10
BUDGET_EXTRA = 10
OUTPUT_USD_PER_MTOK = 1000.0
ANSWER_TOKENS = 8  # completion tokens in every non-streamed answer of bench.upstream
REQUEST_USD = ANSWER_TOKENS * OUTPUT_USD_PER_MTOK / 1e6
BUDGET_USD = (BUDGET_REQUESTS + 0.5) * REQUEST_USD  # half a request of slack: no float edge decides

Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------------- cores


def available_cores() -> list[int]:
    """The CPU ids this process may run on (its affinity), which is what taskset can hand out."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cores_needed(workers: int) -> int:
    """One core per worker, one for the load generator, one for the upstream (and Redis)."""
    return workers + 2


def refusal(workers: int, cores: Sequence[int]) -> str | None:
    """Why the throughput ratio cannot be measured on these cores; None when it can."""
    need = cores_needed(workers)
    if len(cores) >= need:
        return None
    return f"not measured: {workers} workers need {need} cores, this machine has {len(cores)}"


def cpu_list(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)


@dataclass(frozen=True)
class Layout:
    """Which cores each process gets. ``shared``: everything on every core (``--force`` with too few)."""

    gateway: tuple[int, ...]  # the N-worker run's cores; the 1-worker run takes the first of them
    load: tuple[int, ...]
    upstream: tuple[int, ...]  # Redis runs here too: without budgets or rate limits it only syncs stats
    shared: bool

    @classmethod
    def of(cls, workers: int, cores: Sequence[int]) -> Layout:
        if refusal(workers, cores) is not None:
            every = tuple(cores)
            return cls(every, every, every, True)
        return cls(tuple(cores[:workers]), (cores[workers],), (cores[workers + 1],), False)

    def gateway_cores(self, workers: int) -> tuple[int, ...]:
        return self.gateway if self.shared else self.gateway[:workers]

    def as_dict(self) -> dict[str, Any]:
        return {
            "gateway": list(self.gateway),
            "load_generator": list(self.load),
            "upstream_and_redis": list(self.upstream),
            "shared": self.shared,
        }


# ------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    """The repo on the path; no Redis or ledger from the caller's environment; litellm stays offline."""
    return {
        "PYTHONPATH": str(servers.REPO),
        "GATEWAY_REDIS_URL": "",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def start_upstream(port: int, cores: Sequence[int], log_dir: Path) -> Proc:
    argv = [sys.executable, "-m", "bench.upstream", "--port", str(port)]
    return start("upstream", argv, cpus=cpu_list(cores), log_dir=log_dir, env=child_env())


def start_gateway(
    name: str, policy: Path, port: int, workers: int, redis_url: str, cores: Sequence[int], log_dir: Path
) -> Proc:
    """``gateway serve --workers N --redis-url``, the whole process tree on ``cores``; a fresh ledger."""
    ledger = log_dir / f"{name}-ledger.sqlite3"
    for stale in log_dir.glob(f"{name}-ledger.sqlite3*"):
        stale.unlink()
    argv = [sys.executable, "-m", "gateway", "--log-level", "warning", "serve", "--policy", str(policy)]
    argv += ["--port", str(port), "--ledger", str(ledger), "--workers", str(workers)]
    argv += ["--redis-url", redis_url]
    return start(name, argv, cpus=cpu_list(cores), log_dir=log_dir, env=child_env())


class _Answer:
    """httptools' callbacks for one response: its body, and when it is complete."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class Connection:
    """One keep-alive HTTP/1.1 connection to the gateway, one request at a time. The worker that
    accepted it answers every request on it, so asking /ready once says which worker that is."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def call(
        self, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> tuple[int, bytes]:
        """The status and body of one request, within 30 s."""
        lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        async with asyncio.timeout(30.0):
            while not answer.complete:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("the gateway closed the connection")
                parser.feed_data(data)
        return parser.get_status_code(), b"".join(answer.body)

    async def pid(self) -> int | None:
        """The pid of the worker serving this connection, from /ready; None unless it is ready."""
        status, body = await self.call("GET", "/ready")
        return int(json.loads(body)["pid"]) if status == 200 else None

    def close(self) -> None:
        self.writer.close()


async def connections_by_worker(
    port: int, workers: int, each: int, timeout_s: float, max_open: int = 1000
) -> tuple[dict[int, list[Connection]], int]:
    """Fresh connections, opened a few at a time, grouped by the worker the kernel handed each to,
    until every one of ``workers`` holds ``each`` (or the time or ``max_open`` runs out). Extra
    connections are closed; so are all of them if the caller does not use them within uvicorn's
    keep-alive timeout (5 s). Also returns how many were opened: the kernel's hand-out is uneven."""
    grouped: dict[int, list[Connection]] = {}
    deadline = time.monotonic() + timeout_s
    opened = 0

    def done() -> bool:
        return len(grouped) >= workers and all(len(group) >= each for group in grouped.values())

    while not done() and time.monotonic() < deadline and opened < max_open:
        batch: list[Connection] = []
        for result in await asyncio.gather(
            *(Connection.open(port) for _ in range(8)), return_exceptions=True
        ):
            if isinstance(result, Connection):
                batch.append(result)
        opened += 8
        pids = await asyncio.gather(*(conn.pid() for conn in batch), return_exceptions=True)
        for conn, pid in zip(batch, pids, strict=True):
            group = grouped.setdefault(pid, []) if isinstance(pid, int) else None
            if group is not None and len(group) < each:
                group.append(conn)
            else:
                conn.close()
        if not done():
            await asyncio.sleep(0.02)
    return grouped, opened


async def worker_pids(port: int, workers: int, timeout_s: float) -> set[int]:
    """The pids /ready reports over fresh connections, until all ``workers`` have answered."""
    grouped, _ = await connections_by_worker(port, workers, 1, timeout_s)
    for group in grouped.values():
        for conn in group:
            conn.close()
    return set(grouped)


# ----------------------------------------------------------------------------------------- throughput


@dataclass
class FleetWindow:
    """CPU seconds of the gateway's process tree (every worker) between the load generator's window
    marks, and how busy its cores and the harness's were with other processes meanwhile."""

    gateway: Proc
    layout: Layout
    cores: tuple[int, ...]
    harness: tuple[Proc, ...]  # the upstream and Redis; the load generator is this process
    marks: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def __call__(self, mark: str) -> None:
        harness_cores = (*self.layout.load, *self.layout.upstream)
        self.marks[mark] = (
            time.perf_counter(),
            self.gateway.cpu_s(),
            sum(core_busy_s(c) for c in self.cores),
            sum(core_busy_s(c) for c in harness_cores),
            time.process_time() + sum(p.cpu_s() for p in self.harness),
        )

    def _delta(self, i: int) -> float:
        if "start" not in self.marks or "end" not in self.marks:
            return 0.0
        return self.marks["end"][i] - self.marks["start"][i]

    @property
    def cpu_s(self) -> float:
        return self._delta(1)

    def foreign_shares(self) -> dict[str, float | None]:
        """Other processes' share of the gateway's cores and of the harness's; with shared cores, of
        the whole machine (anything but the gateway, the upstream, Redis and the load generator)."""
        wall = self._delta(0)
        if wall <= 0:
            return {"gateway_cores_foreign_share": None, "harness_cores_foreign_share": None}
        if self.layout.shared:
            others = self._delta(2) - self._delta(1) - self._delta(4)
            share = max(0.0, others) / (wall * len(self.cores))
            return {"gateway_cores_foreign_share": share, "harness_cores_foreign_share": share}
        harness_cores = len(self.layout.load) + len(self.layout.upstream)
        return {
            "gateway_cores_foreign_share": max(0.0, self._delta(2) - self._delta(1))
            / (wall * len(self.cores)),
            "harness_cores_foreign_share": max(0.0, self._delta(3) - self._delta(4)) / (wall * harness_cores),
        }


async def saturation(way: Way, s: Settings, stream: bool, window: FleetWindow) -> dict[str, Any]:
    r = await closed_loop(
        way.target(stream), s.concurrency, s.saturation_s, warmup_s=s.warmup_s, on_window=window
    )
    out = latency_summary(r)
    out["concurrency"] = s.concurrency
    out["cpu_s"] = window.cpu_s
    out.update(window.foreign_shares())
    if r.ok:
        out["cpu_ms_per_req"] = window.cpu_s / r.ok * 1000.0
    return out


def settings_for(quick: bool, workers: int, smoke: bool = False) -> Settings:
    """bench.run's phases (--quick: its quick ones); --smoke a few seconds in all, to try the harness."""
    base = Settings.make(quick or smoke, None)
    concurrency = max(64, 32 * workers)  # c=64 saturates one or two workers; more want more
    if smoke:
        return replace(
            base,
            saturation_s=1.0,
            warmup_s=0.3,
            paced_steps=(16,),
            paced_window_s=1.0,
            paced_refine=0,
            concurrency=concurrency,
        )
    # Steps beyond bench.run's: N workers carry more paced streams than one core does.
    if quick:
        return replace(base, paced_steps=(16, 64, 256, 1024), concurrency=concurrency)
    return replace(base, paced_steps=(*base.paced_steps, 2048), concurrency=concurrency)


async def measure_throughput(
    workers: int,
    layout: Layout,
    s: Settings,
    upstream: Proc,
    upstream_port: int,
    redis: Proc,
    redis_url: str,
    out_dir: Path,
    say: Say,
) -> dict[str, Any]:
    """Direct to the upstream (the harness's ceiling and the paced baseline), then 1 and N workers."""
    results: dict[str, Any] = {"layout": layout.as_dict(), "concurrency": s.concurrency, "runs": {}}
    direct = Way("direct", upstream_port, upstream, "fast", "paced", servers.API_KEY)
    direct_window = FleetWindow(upstream, layout, layout.upstream, (redis,))
    say("direct to the upstream: saturation (the load generator's ceiling)")
    results["direct"] = {
        "nonstream": await saturation(direct, s, False, direct_window),
        "stream": await saturation(direct, s, True, FleetWindow(upstream, layout, layout.upstream, (redis,))),
    }
    say(
        f"direct: {results['direct']['nonstream']['rps']:,.0f} req/s, "
        f"{results['direct']['stream']['rps']:,.0f} streams/s; paced streams (baseline and harness limit)"
    )
    direct_paced = await paced(direct, s, None, None, say)
    results["direct"]["paced"] = direct_paced
    baseline, limit = direct_paced["baseline"], direct_paced["capacity"]
    policy = servers.gateway_policy(upstream_port, out_dir)
    for count in sorted({1, workers}):
        cores = layout.gateway_cores(count)
        name = f"{count} worker{'s' if count > 1 else ''}"
        port = free_port()
        say(f"== {name}: gateway serve --workers {count} --redis-url on cores {cpu_list(cores)}")
        proc = start_gateway(f"workers-{count}", policy, port, count, redis_url, cores, out_dir)
        try:
            way = Way(name, port, proc, "bench-fast", "bench-paced", servers.API_KEY, upstream)
            startup = await wait_ready(way, 120.0)
            pids = await worker_pids(port, count, 60.0) if startup is not None else set()
            if startup is None or len(pids) < count:
                say(f"{name} did not start ({len(pids)} workers answered):\n{proc.log_tail()}")
                results["runs"][str(count)] = {"error": proc.log_tail(8)}
                continue
            await asyncio.sleep(1.0)
            run: dict[str, Any] = {"workers": count, "cores": list(cores), "startup_s": startup}
            say(f"{name}: saturation, non-streaming (c={s.concurrency})")
            run["nonstream"] = await saturation(
                way, s, False, FleetWindow(proc, layout, cores, (upstream, redis))
            )
            say(f"{name}: {run['nonstream']['rps']:,.0f} req/s; saturation, streaming 64 chunks")
            run["stream"] = await saturation(
                way, s, True, FleetWindow(proc, layout, cores, (upstream, redis))
            )
            for kind in ("nonstream", "stream"):
                if run[kind]["errors"]:
                    say(f"{name}: {kind} saturation had failed requests: {run[kind]['error_kinds']}")
            say(f"{name}: {run['stream']['rps']:,.0f} streams/s; paced streams")
            run["paced"] = await paced(way, s, baseline, limit, say)
            results["runs"][str(count)] = run
        finally:
            proc.stop()
    results["ratios"] = ratios(results["runs"], workers)
    return results


def _rps(run: dict[str, Any] | None, kind: str) -> float | None:
    if not run or kind not in run:
        return None
    value = run[kind].get("rps")
    return float(value) if isinstance(value, (int, float)) else None


def _capacity(run: dict[str, Any] | None) -> float | None:
    value = (run or {}).get("paced", {}).get("capacity")
    return float(value) if isinstance(value, (int, float)) else None


def ratios(runs: dict[str, Any], workers: int) -> dict[str, float | None]:
    one, many = runs.get("1"), runs.get(str(workers))

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    return {
        "nonstream": ratio(_rps(many, "nonstream"), _rps(one, "nonstream")),
        "stream": ratio(_rps(many, "stream"), _rps(one, "stream")),
        "paced": ratio(_capacity(many), _capacity(one)),
    }


def goal(throughput: dict[str, Any], workers: int, cores: int) -> dict[str, Any]:
    """The issue's goal, for two workers: both non-streamed and streamed throughput at least 1.7x one
    worker's. Not judged on too few cores (shared cores measure the sharing), nor for N != 2."""
    measured = "-"
    r = throughput.get("ratios") or {}
    if r.get("nonstream") is not None or r.get("stream") is not None:
        measured = ", ".join(
            f"{r[k]:.2f}x {label}" if r.get(k) is not None else f"- {label}"
            for k, label in (("nonstream", "non-streamed"), ("stream", "streamed"))
        )
    if not throughput.get("measured") or throughput.get("layout", {}).get("shared"):
        status = f"n/a ({cores} cores)"
        if throughput.get("measured"):
            measured += f"; {SHARED_LABEL}"
    elif workers != 2:
        status = f"n/a (--workers {workers})"
    elif r.get("nonstream") is None or r.get("stream") is None:
        status = "MISSED"
        measured += "; a run did not finish"
    else:
        met = r["nonstream"] >= GOAL_FACTOR and r["stream"] >= GOAL_FACTOR
        status = "met" if met else "MISSED"
    return {"goal": GOAL, "status": status, "measured": measured}


def goal_line(g: dict[str, Any]) -> str:
    return f"- {g['status']}: {g['goal']} (measured {g['measured']})"


THROUGHPUT_HEADER = [
    "workers",
    "cores",
    "req/s",
    "streams/s",
    "paced held",
    "CPU ms/req",
    "p99 ms",
    "errors",
    "others on gw cores %",
]


def _fmt(value: Any, decimals: int = 0) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:,.{decimals}f}"


def throughput_rows(throughput: dict[str, Any], workers: int) -> list[list[str]]:
    rows = []
    direct = throughput.get("direct")
    if direct:
        rows.append(
            [
                "direct (harness)",
                cpu_list(throughput["layout"]["upstream_and_redis"]),
                _fmt(direct["nonstream"].get("rps")),
                _fmt(direct["stream"].get("rps")),
                _fmt(direct.get("paced", {}).get("capacity")),
                "-",
                _fmt(direct["nonstream"].get("p99_ms"), 2),
                str(direct["nonstream"].get("errors", 0) + direct["stream"].get("errors", 0)),
                "-",
            ]
        )
    for count, run in sorted(throughput.get("runs", {}).items(), key=lambda kv: int(kv[0])):
        if "error" in run:
            rows.append([count, "-", "did not start", *["-"] * 6])
            continue
        foreign = run["nonstream"].get("gateway_cores_foreign_share")
        rows.append(
            [
                count,
                cpu_list(run["cores"]),
                _fmt(run["nonstream"].get("rps")),
                _fmt(run["stream"].get("rps")),
                _fmt(run.get("paced", {}).get("capacity")),
                _fmt(run["nonstream"].get("cpu_ms_per_req"), 3),
                _fmt(run["nonstream"].get("p99_ms"), 2),
                str(run["nonstream"].get("errors", 0) + run["stream"].get("errors", 0)),
                _fmt(None if foreign is None else foreign * 100.0, 1),
            ]
        )
    r = throughput.get("ratios") or {}
    many_paced = throughput.get("runs", {}).get(str(workers), {}).get("paced", {})

    def factor(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    rows.append(
        [
            f"ratio {workers}/1",
            "",
            factor(r.get("nonstream")),
            factor(r.get("stream")),
            # Every step held: the harness, not the workers, set the limit, so the ratio is a floor.
            (">=" if many_paced.get("bound") == "harness" and r.get("paced") is not None else "")
            + factor(r.get("paced")),
        ]
        + [""] * 4
    )
    return rows


PACED_HEADER = ["run", "streams", "TTFT p99 ms", "gap p99 ms", "CPU %", "errors", "holds"]


def paced_rows(throughput: dict[str, Any]) -> list[list[str]]:
    runs: list[tuple[str, dict[str, Any]]] = []
    if throughput.get("direct"):
        runs.append(("direct", throughput["direct"]))
    runs += [
        (f"{count} workers" if count != "1" else "1 worker", run)
        for count, run in sorted(throughput.get("runs", {}).items(), key=lambda kv: int(kv[0]))
    ]
    out = []
    for name, run in runs:
        for step in run.get("paced", {}).get("steps", []):
            out.append(
                [
                    name,
                    str(step["concurrency"]),
                    _fmt(step.get("ttft_p99_ms"), 1),
                    _fmt(step.get("gap_p99_ms"), 1),
                    _fmt(step["cpu_share"] * 100.0 if step.get("cpu_share") is not None else None),
                    str(step.get("errors", 0)),
                    "yes" if step.get("passed") else "no",
                ]
            )
    return out


# --------------------------------------------------------------------------------------- shared state


@dataclass(frozen=True)
class CheckKeys:
    limited: str  # RATE_LIMIT requests a minute, on the route without a budget
    spender: str  # no rate limit, on the route with the daily budget


def check_policy(upstream_port: int, keys: CheckKeys) -> str:
    """The bench upstream behind two routes; a store that refuses (503) rather than count alone when
    Redis is slow, so a Redis hiccup on a busy machine shows as itself, not as an overrun limit."""
    limit = f"rate_limit: {{requests_per_minute: {RATE_LIMIT}}}"
    return f"""version: 1
backends:
  bench-upstream:
    dialect: openai
    url: http://127.0.0.1:{upstream_port}/v1
    model: fast
    max_concurrency: 100000
    pricing:
      per_token: {{input_usd_per_mtok: 0.0, output_usd_per_mtok: {OUTPUT_USD_PER_MTOK}}}
routes:
  scaling-limited:
    backends: [bench-upstream]
  scaling-budget:
    backends: [bench-upstream]
    budgets: {{per_day_usd: {BUDGET_USD!r}}}
auth:
  keys:
    - {{name: limited, sha256: {digest_of(keys.limited)}, routes: [scaling-limited], {limit}}}
    - {{name: spender, sha256: {digest_of(keys.spender)}, routes: [scaling-budget]}}
store: {{on_failure: fail_closed, timeout_ms: 2000, key_prefix: "scaling-check:"}}
ledger: {{flush_interval_s: 0.05}}
tuning: {{probes: {{enabled: false}}}}
"""


def outcome(answer: tuple[int, bytes] | BaseException) -> str:
    """What an answer was: admitted, rate_limit_error, budget_exhausted, or what else came back."""
    if isinstance(answer, BaseException):
        return f"no answer: {type(answer).__name__}"
    status, body = answer
    if status == 200:
        return "admitted"
    try:
        error = json.loads(body).get("error", {})
    except ValueError:
        error = {}
    if status == 429 and error.get("type") == "rate_limit_error":
        return "rate_limit_error"
    if status == 429 and error.get("code") == "budget_exhausted":
        return "budget_exhausted"
    return f"http {status} {error.get('type', '')}".strip()


async def burst(
    port: int, workers: int, key: str, route: str, count: int
) -> tuple[list[tuple[int, str]], float, int]:
    """``count`` requests at once, each on a connection of its own, as evenly over the workers as the
    kernel's hand-out allows: (the worker that answered, the outcome) per request, and the seconds the
    burst took from its first request, and how many connections were opened to spread it."""
    each = -(-count // workers)
    grouped, opened = await connections_by_worker(port, workers, each, 30.0)
    # Round-robin over the workers while each has connections left: no worker could admit the
    # fleet's allowance from its share alone.
    order = [
        (pid, conn)
        for rank in range(each)
        for pid, group in grouped.items()
        for conn in group[rank : rank + 1]
    ]
    chosen = order[:count]
    for _, conn in order[count:]:
        conn.close()
    body = orjson.dumps(
        {
            "model": route,
            "messages": [{"role": "user", "content": "Say hello in a few words."}],
            "max_tokens": ANSWER_TOKENS,
        }
    )
    headers = [("authorization", f"Bearer {key}"), ("content-type", "application/json")]
    started = time.monotonic()
    try:
        answers = await asyncio.gather(
            *(conn.call("POST", "/v1/chat/completions", body, headers) for _, conn in chosen),
            return_exceptions=True,
        )
    finally:
        for _, conn in chosen:
            conn.close()
    took = time.monotonic() - started
    answered = [(pid, outcome(answer)) for (pid, _), answer in zip(chosen, answers, strict=True)]
    return answered, took, opened


def ledger_rows(path: Path, where: str, value: str) -> list[dict[str, Any]]:
    """The ledger's rows with ``where`` (a column) equal to ``value``."""
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        query = f"SELECT replica, status, error_type, cost_usd FROM requests WHERE {where} = ?"
        return [dict(row) for row in conn.execute(query, (value,))]
    except sqlite3.OperationalError:  # the writer has not created the table yet
        return []
    finally:
        conn.close()


async def ledger_settled(
    path: Path, where: str, value: str, expected: int, timeout_s: float = 15.0
) -> list[dict[str, Any]]:
    """Those rows once the ledger holds ``expected`` of them (or what it holds at the timeout)."""
    deadline = time.monotonic() + timeout_s
    rows = ledger_rows(path, where, value)
    while len(rows) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        rows = ledger_rows(path, where, value)
    return rows


def tally(pairs: Sequence[tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """Per worker (its pid), requests admitted and refused."""
    out: dict[str, dict[str, int]] = {}
    for worker, admitted in pairs:
        counts = out.setdefault(worker, {"admitted": 0, "refused": 0})
        counts["admitted" if admitted else "refused"] += 1
    return dict(sorted(out.items()))


async def run_phase(
    name: str,
    port: int,
    workers: int,
    key: str,
    route: str,
    sent: int,
    allowed: int,
    refusal_kind: str,
    ledger: tuple[Path, str, str],
) -> dict[str, Any]:
    """One burst of ``sent`` requests where ``allowed`` may pass, judged: exactly ``allowed`` admitted,
    every other one refused with ``refusal_kind``, more than one worker answering, and the ledger
    agreeing with the answers on which worker admitted and refused how many."""
    answered, took, opened = await burst(port, workers, key, route, sent)
    outcomes = Counter(kind for _, kind in answered)
    by_worker = tally([(str(pid), kind == "admitted") for pid, kind in answered])
    rows = await ledger_settled(*ledger, expected=len(answered))
    in_ledger = tally([(str(row["replica"]).rpartition(":")[2], row["status"] == "ok") for row in rows])
    problems: list[str] = []
    admitted, refused = outcomes.get("admitted", 0), outcomes.get(refusal_kind, 0)
    if len(answered) < sent:
        problems.append(f"{name}: connections to the workers for only {len(answered)} of {sent} requests")
    if admitted != allowed:
        problems.append(f"{name}: {admitted} of {len(answered)} admitted, the limit allows exactly {allowed}")
    if refused != len(answered) - allowed:
        problems.append(f"{name}: {refused} refused with {refusal_kind}, expected {len(answered) - allowed}")
    others = {k: v for k, v in outcomes.items() if k not in ("admitted", refusal_kind)}
    if others:
        problems.append(f"{name}: other answers {others}")
    if workers > 1 and len(by_worker) < 2:
        problems.append(f"{name}: one worker answered every request; the fleet-wide count was not exercised")
    if in_ledger != by_worker:
        problems.append(
            f"{name}: the ledger's rows per worker {in_ledger} differ from the answers' {by_worker}"
        )
    if took >= 55.0:
        problems.append(f"{name}: took {took:.0f} s, too near the minute to judge")
    return {
        "name": name,
        "sent": len(answered),
        "allowed": allowed,
        "outcomes": dict(outcomes),
        "seconds": round(took, 2),
        "connections_opened": opened,
        "by_worker": by_worker,
        "spent_usd": sum(float(row["cost_usd"] or 0.0) for row in rows),
        "problems": problems,
    }


async def check_shared_state(
    workers: int,
    cores: Sequence[int],
    upstream_port: int,
    redis_url: str,
    out_dir: Path,
    say: Say,
) -> dict[str, Any]:
    """N workers over one Redis: a key's requests per minute and a route's daily budget hold across
    the fleet. Each burst goes over connections of their own, spread over the workers (the kernel hands
    them out; /ready on each says to which worker), so no worker's share alone reaches the limit."""
    log_dir = out_dir / "shared-state"
    log_dir.mkdir(parents=True, exist_ok=True)
    keys = CheckKeys(new_key(), new_key())
    policy = log_dir / "policy.yaml"
    policy.write_text(check_policy(upstream_port, keys))
    ledger = log_dir / "shared-state-ledger.sqlite3"
    port = free_port()
    problems: list[str] = []
    result: dict[str, Any] = {
        "workers": workers,
        "cores": list(cores),
        "redis_url": redis_url,
        "rate_limit": {"requests_per_minute": RATE_LIMIT},
        "budget": {"per_day_usd": BUDGET_USD, "request_usd": REQUEST_USD, "admits": BUDGET_REQUESTS},
        "problems": problems,
    }
    say(f"== shared state: gateway serve --workers {workers} --redis-url on cores {cpu_list(cores)}")
    proc = start_gateway("shared-state", policy, port, workers, redis_url, cores, log_dir)
    try:
        pids = await worker_pids(port, workers, 60.0)
        result["workers_on_ready"] = sorted(pids)
        if len(pids) < workers:
            problems.append(f"only {len(pids)} of {workers} workers answered /ready:\n{proc.log_tail(8)}")
        else:
            say(f"all {workers} workers answer /ready (pids {', '.join(map(str, sorted(pids)))})")
            sent = RATE_LIMIT + RATE_EXTRA
            say(
                f"rate limit: {sent} requests at once, a connection each, spread over the workers; "
                f"{RATE_LIMIT} a minute allowed"
            )
            result["rate_limit"].update(
                await run_phase(
                    "rate limit",
                    port,
                    workers,
                    keys.limited,
                    "scaling-limited",
                    sent,
                    RATE_LIMIT,
                    "rate_limit_error",
                    (ledger, "api_key_name", "limited"),
                )
            )
            sent = BUDGET_REQUESTS + BUDGET_EXTRA
            say(
                f"budget: {sent} requests at once, spread likewise; ${BUDGET_USD:.3f} a day admits "
                f"{BUDGET_REQUESTS}"
            )
            budget = await run_phase(
                "budget",
                port,
                workers,
                keys.spender,
                "scaling-budget",
                sent,
                BUDGET_REQUESTS,
                "budget_exhausted",
                (ledger, "route", "scaling-budget"),
            )
            expected_usd = BUDGET_REQUESTS * REQUEST_USD
            if abs(budget["spent_usd"] - expected_usd) > REQUEST_USD / 10:
                budget["problems"].append(
                    f"budget: the ledger charged ${budget['spent_usd']:.4f}, expected ${expected_usd:.4f}"
                )
            result["budget"].update(budget)
            problems += result["rate_limit"]["problems"] + budget["problems"]
    finally:
        proc.stop()
    result["passed"] = not problems
    return result


def _workers_line(phase: dict[str, Any]) -> str:
    split = "; ".join(
        f"pid {pid} admitted {c['admitted']}, refused {c['refused']}" for pid, c in phase["by_worker"].items()
    )
    alone = all(c["admitted"] + c["refused"] <= phase["allowed"] for c in phase["by_worker"].values())
    why = " (each worker's share is within the limit: only a shared count can refuse any)" if alone else ""
    opened = phase.get("connections_opened")
    spread = f" ({opened} connections opened to spread {phase['sent']})" if opened else ""
    return f"  by worker{spread}: {split}{why}"


def check_lines(check: dict[str, Any]) -> list[str]:
    rate, budget = check.get("rate_limit", {}), check.get("budget", {})
    verdict = "PASSED" if check.get("passed") else "FAILED"
    store = "over one Redis" if str(check.get("redis_url", "")).startswith("redis") else "without Redis"
    lines = [f"shared state, {check.get('workers')} workers {store}: {verdict}"]
    if "outcomes" in rate:
        o = rate["outcomes"]
        lines.append(
            f"- rate limit {rate['requests_per_minute']}/min: {rate['sent']} sent, {o.get('admitted', 0)} "
            f"admitted, {o.get('rate_limit_error', 0)} refused 429 rate_limit_error ({rate['seconds']} s)"
        )
        lines.append(_workers_line(rate))
    if "outcomes" in budget:
        o = budget["outcomes"]
        lines.append(
            f"- daily budget ${budget['per_day_usd']:.3f} (${budget['request_usd']:.3f} a request, admits "
            f"{budget['admits']}): {budget['sent']} sent, {o.get('admitted', 0)} admitted, "
            f"{o.get('budget_exhausted', 0)} refused 429 budget_exhausted; ledger ${budget['spent_usd']:.3f}"
        )
        lines.append(_workers_line(budget))
    lines += [f"- problem: {p}" for p in check.get("problems", [])]
    return lines


# ------------------------------------------------------------------------------------------- reports


def markdown(results: dict[str, Any]) -> str:
    meta, throughput = results["meta"], results["throughput"]
    workers = meta["workers"]
    parts = [
        f"# gateway serve --workers {workers}: scaling and shared state",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; cores this run may use: {meta['cores']}  ",
        f"Run: {meta['started_at']}, {meta['wall_s']:.0f} s; load average before/after: "
        f"{meta['loadavg_start']} / {meta['loadavg_end']}",
        "",
        "## Throughput per added core",
        "",
    ]
    if not throughput["measured"]:
        parts += [str(throughput["refusal"]), ""]
    else:
        if throughput["layout"]["shared"]:
            why = str(throughput["refusal"]).removeprefix("not measured: ")
            parts += [f"**{SHARED_LABEL}** ({why}; run with --force, every process on every core)", ""]
        parts += [report.md_table(THROUGHPUT_HEADER, throughput_rows(throughput, workers)), ""]
    parts += [goal_line(results["goal"]), ""]
    if throughput["measured"]:
        parts += [
            "### Paced streams (first token after 100 ms, then 50 tokens/s)",
            "",
            "A step holds when TTFT p99 and gap p99 stay within 2x the upstream's own (direct, lowest step), "
            "with no errors; direct's highest holding step is the harness's limit.",
            "",
            report.md_table(PACED_HEADER, paced_rows(throughput)),
            "",
        ]
    parts += ["## Shared state", "", *check_lines(results["shared_state"])]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------- main


async def run(
    args: argparse.Namespace, cores: Sequence[int], say: Say
) -> tuple[dict[str, Any], dict[str, Any]]:
    out_dir: Path = args.out
    why_not = refusal(args.workers, cores)
    measure = why_not is None or args.force
    layout = Layout.of(args.workers, cores)
    throughput: dict[str, Any] = {"measured": measure, "refusal": why_not, "layout": layout.as_dict()}
    procs: list[Proc] = []
    try:
        redis_port, upstream_port = free_port(), free_port()
        say(
            f"starting redis-server on port {redis_port} and the upstream on {upstream_port} "
            f"(cores {cpu_list(layout.upstream)})"
        )
        redis = start_redis("redis", redis_port, cpus=cpu_list(layout.upstream), log_dir=out_dir)
        procs.append(redis)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        upstream = start_upstream(upstream_port, layout.upstream, out_dir)
        procs.append(upstream)
        direct = Way("direct", upstream_port, upstream, "fast", "paced", servers.API_KEY)
        if await wait_ready(direct, 20.0) is None:
            raise RuntimeError("the upstream did not start:\n" + upstream.log_tail())
        if why_not is not None:
            say(why_not + (f"; --force: measuring anyway ({SHARED_LABEL})" if args.force else ""))
        if measure:
            s = settings_for(args.quick, args.workers, args.smoke)
            throughput.update(
                await measure_throughput(
                    args.workers, layout, s, upstream, upstream_port, redis, redis_url, out_dir, say
                )
            )
        check = await check_shared_state(args.workers, layout.gateway, upstream_port, redis_url, out_dir, say)
    finally:
        for proc in reversed(procs):
            proc.stop()
    return throughput, check


def main(argv: list[str] | None = None, *, cores: Sequence[int] | None = None, say: Say | None = None) -> int:
    """``cores``: the CPU ids the run may use (default: this process's affinity)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=2, help="the worker count compared with one (2)")
    parser.add_argument("--quick", action="store_true", help="bench.run's short phases (about 2 minutes)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="seconds-long phases, one paced step: tries the harness, no figure",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"measure throughput even with fewer than workers + 2 cores ({SHARED_LABEL})",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where scaling.json, .md and logs go")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2 (it is compared with one worker)")
    progress: Say = say or Progress()
    show: Say = say or print  # tables and results without the progress lines' timestamps
    if shutil.which("redis-server") is None:
        print(
            "redis-server is not installed (Debian: apt-get install redis-server); nothing measured",
            file=sys.stderr,
        )
        return 2
    cores = list(cores) if cores is not None else available_cores()
    args.out.mkdir(parents=True, exist_ok=True)
    layout = Layout.of(args.workers, cores)
    if not layout.shared:
        pin_self(set(layout.load))  # the load generator's own core; the others are the servers'
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    load_start = loadavg()
    import uvloop

    throughput, check = uvloop.run(run(args, cores, progress))
    results: dict[str, Any] = {
        "meta": {
            "command": " ".join(["python -m bench.scaling", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine(),
            "cores": len(cores),
            "core_ids": list(cores),
            "workers": args.workers,
            "quick": args.quick,
            "smoke": args.smoke,
            "force": args.force,
            "started_at": started,
            "wall_s": time.perf_counter() - t0,
            "loadavg_start": load_start,
            "loadavg_end": loadavg(),
        },
        "throughput": throughput,
        "shared_state": check,
    }
    results["goal"] = goal(throughput, args.workers, len(cores))
    (args.out / "scaling.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (args.out / "scaling.md").write_text(markdown(results))
    show("")
    if not throughput["measured"]:
        show(str(throughput["refusal"]))
    else:
        if throughput["layout"]["shared"]:
            show(f"{SHARED_LABEL} ({throughput['refusal']}; --force)")
        show(report.text_table(THROUGHPUT_HEADER, throughput_rows(throughput, args.workers)))
        show("")
        show(report.text_table(PACED_HEADER, paced_rows(throughput)))
    show("")
    show(goal_line(results["goal"]))
    show("")
    for line in check_lines(check):
        show(line)
    show(f"\nwrote {args.out / 'scaling.json'}, {args.out / 'scaling.md'}")
    return 0 if check.get("passed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
