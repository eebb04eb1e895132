"""Reliability rows for overload and slow clients: a real ``gateway serve`` over an emulated pool that
takes a few requests at once, first at about what the pool can take (1x), then at ten times that
(10x), then with slow-loris connections (headers or bodies trickled) open among normal traffic.

What must hold: past ``server.max_in_flight`` requests are shed with 503 and Retry-After, past the
route's waiting queue with 429 and Retry-After, nothing else fails; the p99 of the requests admitted
at 10x stays near the one at 1x; /health answers all through; the gateway's memory, tasks and sockets
come back; trickling connections are cut (408) while normal traffic is answered as before.

    python -m bench.reliability --only overload [--short]
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import httpx

from bench.procs import Proc
from bench.reliability.process import open_fds, open_sockets, pss_bytes, start_emulator, start_gateway
from bench.reliability.row import Row, Settings
from tests.servers import free_port

SEATS = 4  # the pool's max_concurrency: what the backend takes at once
IN_FLIGHT = 8  # server.max_in_flight: the pool's seats and as many waiting
MAX_WAIT_S = 0.25  # the route's waiting.max_wait_s: what an admitted request may queue for
TIMEOUT_S = 30.0  # a client's patience: past it a request counts as a failure
SHED_STATUSES = (429, 503)


@dataclass
class Plan:
    rate_1x: float  # requests per second the pool takes about fully
    seconds_1x: float
    seconds_10x: float
    tricklers: int
    seconds_loris: float

    @classmethod
    def of(cls, settings: Settings) -> Plan:
        if settings.short:
            return cls(rate_1x=20.0, seconds_1x=5.0, seconds_10x=6.0, tricklers=40, seconds_loris=6.0)
        return cls(rate_1x=20.0, seconds_1x=30.0, seconds_10x=120.0, tricklers=200, seconds_loris=30.0)


@dataclass
class Outcomes:
    """What a client saw of each request: status (0: no answer at all), latency of those answered 200."""

    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)  # the error codes of the sheds
    latencies_s: list[float] = field(default_factory=list)
    shed_latencies_s: list[float] = field(default_factory=list)  # how fast a 503 shed comes back
    broken: list[str] = field(default_factory=list)  # answered, but not as a client may be answered
    # The longest the measuring client's own loop was late: a stall here (the machine busy elsewhere)
    # lengthens every latency it times without the gateway having been slower.
    client_stall_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def shed(self) -> int:
        return sum(self.statuses[s] for s in SHED_STATUSES)

    @property
    def failures(self) -> int:
        """Anything other than an answer or a shed with Retry-After."""
        return self.requests - self.statuses[200] - self.shed + len(self.broken)

    def p99_s(self, shed: bool = False, q: float = 0.99) -> float | None:
        ordered = sorted(self.shed_latencies_s if shed else self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def policy_text(pool_url: str) -> str:
    return f"""
server: {{max_in_flight: {IN_FLIGHT}, shed_retry_after_s: 1, header_timeout_s: 2, body_timeout_s: 2}}
backends:
  pool:
    dialect: vllm
    url: {pool_url}/v1
    model: moonshotai/Kimi-K3
    max_concurrency: {SEATS}
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    signals: {{health_url: {pool_url}/health}}
    timeouts: {{first_byte_s: 20, idle_s: 20}}
routes:
  kimi-k3:
    backends: [pool]
    waiting: {{max_wait_s: {MAX_WAIT_S}, max_waiting: {2 * IN_FLIGHT}}}
tuning: {{probes: {{enabled: false}}}}
"""


@contextlib.contextmanager
def pool_and_gateway(settings: Settings) -> Iterator[tuple[Proc, str]]:
    out = settings.out_dir / "overload"
    out.mkdir(parents=True, exist_ok=True)
    pool_port, port = free_port(), free_port()
    pool = start_emulator("overload-pool", "b300-vllm", pool_port, out, "--time-scale", "0.1")
    gateway: Proc | None = None
    try:
        pool_url = f"http://127.0.0.1:{pool_port}"
        # Short answers at a tenth of real time: ~0.1 s to the first token, ~0.03 s of decoding.
        faults = {"reasoning_tokens": 0, "content_tokens": 30}
        httpx.post(pool_url + "/emulator/faults", json=faults, timeout=10).raise_for_status()
        policy = out / "policy.yaml"
        policy.write_text(policy_text(pool_url))
        gateway = start_gateway(
            "overload-gateway", policy, port, out, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        )
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        if gateway is not None:
            gateway.stop(timeout_s=30)
        pool.stop()


async def one_request(session: aiohttp.ClientSession, url: str, n: int, outcomes: Outcomes) -> None:
    stream = n % 2 == 1
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": f"question {n}"}], "stream": stream}
    started = time.perf_counter()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            raw = await response.read()
            outcomes.statuses[response.status] += 1
            if response.status == 200:
                outcomes.latencies_s.append(time.perf_counter() - started)
                if (b"data: [DONE]" if stream else b'"choices"') not in raw:
                    outcomes.broken.append(f"200 without a whole answer: {raw[-120:]!r}")
            elif response.status in SHED_STATUSES:
                if response.status == 503:  # a 429 has waited its route's max_wait_s first
                    outcomes.shed_latencies_s.append(time.perf_counter() - started)
                code = json.loads(raw)["error"]["code"]
                outcomes.codes[code] += 1
                if "retry-after" not in response.headers:
                    outcomes.broken.append(f"{response.status} {code} without Retry-After")
                if (response.status, code) not in ((503, "gateway_overloaded"), (429, "backends_busy")):
                    outcomes.broken.append(f"{response.status} {code}: not a shed")
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcomes.statuses[0] += 1
        outcomes.broken.append(f"no answer: {type(exc).__name__}")


async def open_loop(url: str, rate: float, seconds: float, health: Counter[int] | None = None) -> Outcomes:
    """``rate`` requests a second for ``seconds``, each sent on time whatever the earlier ones do; with
    ``health``, /health is asked every 100 ms meanwhile and its statuses counted (0: no answer in 5 s)."""
    outcomes = Outcomes()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        done = asyncio.Event()

        async def watch_health() -> None:
            assert health is not None
            while not done.is_set():
                try:
                    async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                        health[r.status] += 1
                except (aiohttp.ClientError, TimeoutError):
                    health[0] += 1
                await asyncio.sleep(0.1)

        async def watch_own_loop(tick_s: float = 0.01) -> None:
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(tick_s)
                outcomes.client_stall_s = max(outcomes.client_stall_s, time.perf_counter() - before - tick_s)

        watcher = asyncio.create_task(watch_health()) if health is not None else None
        stalls = asyncio.create_task(watch_own_loop())
        tasks = []
        # In a long-lived process (the test run) a full collection of everything it holds can stop
        # this loop for longer than the answers it is timing take; nothing here needs it for seconds.
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            for n in range(int(rate * seconds)):
                delay = start + n / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one_request(session, url, n, outcomes)))
            await asyncio.gather(*tasks)
        finally:
            gc.enable()
        done.set()
        await stalls
        if watcher is not None:
            await watcher
    return outcomes


async def trickle(url: str, body: bool, stop_after_s: float) -> str:
    """A slow-loris connection: headers (or, with ``body``, a body) one byte every 0.25 s. Returns what
    ended it: "408" (the gateway's cut), another status, "closed" (cut without a word) or "still open"."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
    if body:
        head += b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    writer.write(head)

    async def drip() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.25)
                writer.write(b"a" if body else b"x")
                await writer.drain()

    dripping = asyncio.create_task(drip())
    received = b""
    try:
        async with asyncio.timeout(stop_after_s):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return "still open"
    except ConnectionError:
        pass
    finally:
        dripping.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return received.split(b" ", 2)[1].decode() if received.startswith(b"HTTP/1.1 ") else "closed"


def ready(url: str) -> dict[str, object]:
    body: dict[str, object] = httpx.get(url + "/ready", timeout=10).json()
    return body


def settle(gateway: Proc, url: str, sockets_floor: int) -> None:
    """Let connections the clients closed reach the gateway's side before counting what it holds."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and open_sockets(gateway.pid) > sockets_floor:
        time.sleep(0.2)


def overload_row(settings: Settings, plan: Plan, gateway: Proc, url: str) -> Row:
    row = Row("overload 10x: shed early")
    settings.say(f"overload: 1x, {plan.rate_1x:g} req/s for {plan.seconds_1x:g} s")
    cpu_start = gateway.cpu_s()
    base = asyncio.run(open_loop(url, plan.rate_1x, plan.seconds_1x))
    cpu_1x = gateway.cpu_s() - cpu_start
    time.sleep(1.0)
    fds, sockets = open_fds(gateway.pid), open_sockets(gateway.pid)
    row.memory_before_bytes = pss_bytes(gateway.pid)
    settings.say(f"overload: 10x, {10 * plan.rate_1x:g} req/s for {plan.seconds_10x:g} s")
    health: Counter[int] = Counter()
    cpu_start = gateway.cpu_s()
    heavy = asyncio.run(open_loop(url, 10 * plan.rate_1x, plan.seconds_10x, health))
    cpu_10x = gateway.cpu_s() - cpu_start
    settle(gateway, url, sockets)
    row.memory_after_bytes = pss_bytes(gateway.pid)
    in_flight = ready(url)["in_flight"]
    assert isinstance(in_flight, dict)
    row.requests = base.requests + heavy.requests
    row.client_visible_failures = base.failures + heavy.failures + heavy.shed + base.shed
    row.expected_failures = heavy.shed + base.shed
    p99_1x, p99_10x = base.p99_s(), heavy.p99_s()
    row.details = {
        "1x": {
            "requests": base.requests,
            "statuses": dict(base.statuses),
            "p99_admitted_s": p99_1x,
            "client_stall_s": round(base.client_stall_s, 3),
            "gateway_cpu_ms_per_request": round(1000 * cpu_1x / max(1, base.requests), 3),
        },
        "10x": {
            "requests": heavy.requests,
            "statuses": dict(heavy.statuses),
            "shed_by_code": dict(heavy.codes),
            "p99_admitted_s": p99_10x,
            "client_stall_s": round(heavy.client_stall_s, 3),
            "p50_shed_503_s": heavy.p99_s(shed=True, q=0.5),
            "p99_shed_503_s": heavy.p99_s(shed=True),
            # What the whole 10x costs the gateway per request, sheds included: shedding is cheap
            # when this is well under the 1x figure, where every request is proxied.
            "gateway_cpu_ms_per_request": round(1000 * cpu_10x / max(1, heavy.requests), 3),
        },
        "health_answers_during_10x": dict(health),
        "in_flight_after": in_flight,
        "broken": (base.broken + heavy.broken)[:10],
    }
    if base.failures or heavy.failures:
        row.problems.append(
            f"{base.failures + heavy.failures} failures besides sheds: {row.details['broken']}"
        )
    if base.shed > base.requests // 10:
        row.problems.append(f"1x shed {base.shed} of {base.requests}: the pool should take 1x")
    if not heavy.codes["gateway_overloaded"]:
        row.problems.append("10x shed nothing at the gate (no 503 gateway_overloaded)")
    if not health or set(health) != {200}:
        row.problems.append(f"/health during 10x: {dict(health)}")
    # An admitted request may wait its route's max_wait_s, then is served as at 1x; what the measuring
    # client lost to its own stalls is not the gateway's.
    if p99_1x is not None and p99_10x is not None:
        allowed_s = 2 * p99_1x + MAX_WAIT_S + heavy.client_stall_s
        if p99_10x > allowed_s:
            row.problems.append(
                f"p99 of admitted at 10x {p99_10x:.3f}s vs {p99_1x:.3f}s at 1x (allowed {allowed_s:.3f}s,"
                f" client stalled {heavy.client_stall_s:.3f}s)"
            )
    if in_flight["now"] != 0:
        row.leaks.append(f"in_flight {in_flight['now']}")
    if in_flight["peak"] > IN_FLIGHT:
        row.problems.append(f"in flight peaked at {in_flight['peak']} over the bound {IN_FLIGHT}")
    if open_fds(gateway.pid) > fds + 8:
        row.leaks.append(f"fds {fds} -> {open_fds(gateway.pid)}")
    grown = row.memory_after_bytes - row.memory_before_bytes
    if grown > max(16 << 20, row.memory_before_bytes // 5):
        row.problems.append(f"PSS grew {grown >> 20} MiB under 10x")
    return row


async def loris_and_traffic(url: str, plan: Plan) -> tuple[list[str], Outcomes]:
    cut_after = plan.seconds_loris + 10.0  # the gateway cuts at 2 s; this only bounds the test
    tricklers = [asyncio.create_task(trickle(url, n % 2 == 1, cut_after)) for n in range(plan.tricklers)]
    traffic = await open_loop(url, plan.rate_1x / 2, plan.seconds_loris)
    return list(await asyncio.gather(*tricklers)), traffic


def loris_row(settings: Settings, plan: Plan, gateway: Proc, url: str) -> Row:
    row = Row("slow-loris: trickled headers and bodies")
    sockets, fds = open_sockets(gateway.pid), open_fds(gateway.pid)
    row.memory_before_bytes = pss_bytes(gateway.pid)
    settings.say(f"slow-loris: {plan.tricklers} trickling connections among normal traffic")
    ends, traffic = asyncio.run(loris_and_traffic(url, plan))
    settle(gateway, url, sockets)
    row.memory_after_bytes = pss_bytes(gateway.pid)
    cut = Counter(ends)
    row.requests = traffic.requests + len(ends)
    row.expected_failures = cut["408"]
    row.client_visible_failures = traffic.failures + traffic.shed + len(ends)
    row.details = {
        "trickling": dict(cut),
        "normal": {"statuses": dict(traffic.statuses), "p99_s": traffic.p99_s()},
        "gateway_sockets_before_after": [sockets, open_sockets(gateway.pid)],
    }
    if cut["408"] != len(ends):
        row.problems.append(f"trickling connections not cut with 408: {dict(cut)}")
    if traffic.failures or traffic.shed:
        row.problems.append(f"normal traffic failed: {dict(traffic.statuses)} {traffic.broken[:5]}")
    if open_sockets(gateway.pid) > sockets + 8:
        row.leaks.append(f"sockets {sockets} -> {open_sockets(gateway.pid)}")
    if open_fds(gateway.pid) > fds + 8:
        row.leaks.append(f"fds {fds} -> {open_fds(gateway.pid)}")
    return row


def run(settings: Settings) -> list[Row]:
    plan = Plan.of(settings)
    with pool_and_gateway(settings) as (gateway, url):
        return [overload_row(settings, plan, gateway, url), loris_row(settings, plan, gateway, url)]
