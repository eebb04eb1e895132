"""Recovery and start-up judged against the SLO (issue 29), created for real: the gateway on loopback over
the emulators, a slow spell injected into the pool while traffic still reaches it, a pool's cold boot,
and fresh gateways in front of a slow and a fast candidate.

The gateway runs on the emulators' clock at ``TIME_SCALE`` (one real second is five emulated ones), so
the issue's 25 s spell and 20 s bound are emulated seconds and the whole file takes under a minute of
real time. The policy keeps the default tuning (probe interval, half-life, recovery probes): only the
clock is faster.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import PAID_KEY, Gateway, Upstreams, emulated_clock, emulated_upstreams, policy_yaml
from tests.conftest import running_gateway as serve_policy

TIME_SCALE = 0.2
HELLO = [{"role": "user", "content": "Hello there"}]
ROUTES = """
  interactive:
    backends: [b300-vllm, paid-api]
    slo: {ttft_p95_ms: 2000}
  batch:
    backends: [b300-vllm]
    fallback: {max_attempts: 1}
  start:
    backends: [a100-llamacpp, paid-api]
    slo: {ttft_p95_ms: 2000}
"""
# The A100 emulator answers in 7 s; billed marginally it is the cheapest candidate, as in the issue.
MARGINAL_A100 = (
    "pricing: {gpu_hours: {usd_per_hour: 20.09}}",
    "pricing: {gpu_hours: {usd_per_hour: 20.09, accounting: marginal}}",
)


# The API's first token at ~1.7 s, still within the 2 s SLO: its start-up probe takes long enough that a
# gateway not waiting for it would send its first requests blind.
SLOWER_API_MS = 1200


@dataclass
class Sent:
    at: float  # emulated seconds, the gateway's clock
    backend: str


@pytest.fixture(scope="module")
def recovery_upstreams() -> Iterator[Upstreams]:
    with emulated_upstreams(TIME_SCALE) as up:
        yield up


def running_gateway(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *edits: tuple[str, str],
    api_ttft_ms: float = 0.0,
) -> Any:
    """A fresh gateway; ``api_ttft_ms`` slows the paid API's first token from before it starts."""
    upstreams.reset()
    httpx.post(
        upstreams.paid.url + "/emulator/faults", json={"added_ttft_ms": api_ttft_ms}
    ).raise_for_status()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    text = policy_yaml(upstreams, ROUTES)
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return serve_policy(path, clock=emulated_clock(TIME_SCALE), rng=random.Random(7), policy_poll_s=0.05)


def set_faults(upstreams: Upstreams, **faults: Any) -> None:
    httpx.post(upstreams.vllm.url + "/emulator/faults", json=faults).raise_for_status()


class Traffic:
    """A request every ``every_s`` emulated seconds on each route, sent on time whatever the answers
    take (several in flight), as a user's steady load would."""

    def __init__(self, gateway: Gateway, routes: dict[str, float]) -> None:
        self.gateway = gateway
        self.routes = routes
        self.sent: dict[str, list[Sent]] = {route: [] for route in routes}
        self.failures: list[str] = []

    async def run_until(self, done: Any) -> None:
        clock = self.gateway.runtime.clock
        async with httpx.AsyncClient(timeout=120) as client:
            tasks: set[asyncio.Task[None]] = set()
            due = dict.fromkeys(self.routes, clock())
            while not done():
                now = clock()
                for route, every_s in self.routes.items():
                    if now >= due[route]:
                        due[route] = now + every_s
                        task = asyncio.create_task(self._one(client, route, now))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                await asyncio.sleep(0.01)
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, route: str, at: float) -> None:
        body = {"model": route, "messages": HELLO, "max_tokens": 16, "stream": True}
        response = await client.post(self.gateway.base_url + "/chat/completions", json=body)
        if response.status_code != 200:
            self.failures.append(f"{route}: {response.status_code} {response.text[:200]}")
            return
        self.sent[route].append(Sent(at, response.headers["x-gateway-backend"]))

    def for_a_while(self, seconds: float) -> Any:
        clock = self.gateway.runtime.clock
        until = clock() + seconds
        return lambda: clock() >= until


def recovery_times(sent: list[Sent], since: float, pool: str = "b300-vllm") -> tuple[float, float]:
    """Emulated seconds from ``since`` to the pool's first user request, and to its share being back:
    the first request from which on at least 6 of every 8 went to the pool."""
    after = sorted((s for s in sent if s.at >= since), key=lambda s: s.at)
    first = next((s.at - since for s in after if s.backend == pool), float("inf"))
    share = float("inf")
    for i in range(len(after) - 8):
        rest = after[i:]
        windows = [rest[j : j + 8] for j in range(0, len(rest) - 7)]
        if all(sum(s.backend == pool for s in window) >= 6 for window in windows):
            share = after[i].at - since
            break
    return first, max(first, share)


@pytest.mark.parametrize("batch", [True, False], ids=["with-other-traffic", "probes-only"])
async def test_a_pool_that_kept_some_traffic_through_a_slow_spell_is_back_within_20_s(
    recovery_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    # With a batch route still using the pool, its answers show the recovery; without, probes do.
    with running_gateway(recovery_upstreams, tmp_path, monkeypatch) as gateway:
        traffic = Traffic(gateway, {"interactive": 0.25, "batch": 1.0} if batch else {"interactive": 0.25})
        await traffic.run_until(traffic.for_a_while(40.0))  # the pool measured at ~1 s by users
        before = [s.backend for s in traffic.sent["interactive"]][-60:]
        assert before.count("b300-vllm") >= 55, before

        set_faults(recovery_upstreams, added_ttft_ms=4000)  # TTFT ~5 s against the 2 s SLO, for 25 s
        spell_began = gateway.runtime.clock()
        await traffic.run_until(traffic.for_a_while(25.0))
        set_faults(recovery_upstreams, added_ttft_ms=0)
        spell_ended = gateway.runtime.clock()
        during = [s.backend for s in traffic.sent["interactive"] if spell_began + 10 <= s.at < spell_ended]
        assert during and during.count("paid-api") >= 0.9 * len(during), "traffic left the slow pool"
        if batch:
            kept = [s for s in traffic.sent["batch"] if spell_began <= s.at < spell_ended]
            assert len(kept) >= 20, "the pool kept some traffic through the spell: fast and slow samples mix"

        await traffic.run_until(traffic.for_a_while(35.0))
        first, share = recovery_times(traffic.sent["interactive"], spell_ended)
        print(f"slow spell: first pool request {first:.1f} s after its end, share back after {share:.1f} s")
        assert first <= 20.0 and share <= 20.0, (first, share)

        # A cold boot of the pool: 30 emulated seconds of 503 from its health check, then up again.
        set_faults(recovery_upstreams, cold_boot_s=30)
        booted = traffic.for_a_while(30.0)
        await traffic.run_until(booted)
        await traffic.run_until(lambda: httpx.get(recovery_upstreams.vllm.url + "/health").status_code == 200)
        boot_ended = gateway.runtime.clock()
        await traffic.run_until(traffic.for_a_while(30.0))
        first, share = recovery_times(traffic.sent["interactive"], boot_ended)
        print(f"cold boot: first pool request {first:.1f} s after it was up, share back after {share:.1f} s")
        assert first <= 20.0 and share <= 20.0, (first, share)
        assert not [f for f in traffic.failures if f.startswith("interactive")], traffic.failures


async def first_hundred(gateway: Gateway) -> list[str]:
    """The first 100 requests of the ``start`` route, four at a time: the backend each went to first."""
    backends: list[str] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def one() -> None:
            body = {"model": "start", "messages": HELLO, "max_tokens": 16}
            response = await client.post(gateway.base_url + "/chat/completions", json=body)
            assert response.status_code == 200, response.text
            # A request that met the slow pool first timed out there and fell back: count where it went.
            tried = "a100-llamacpp" if response.headers["x-gateway-attempts"] != "1" else None
            backends.append(tried or response.headers["x-gateway-backend"])

        for _ in range(100 // 4):
            await asyncio.gather(*(one() for _ in range(4)))
    return backends


async def test_a_fresh_gateway_sends_none_of_its_first_100_requests_to_a_candidate_declared_too_slow(
    recovery_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    declared = (
        "    max_concurrency: 4\n",
        "    max_concurrency: 4\n    expected_ttft_ms: 7000\n",
    )
    with running_gateway(
        recovery_upstreams, tmp_path, monkeypatch, MARGINAL_A100, declared, api_ttft_ms=SLOWER_API_MS
    ) as gateway:
        backends = await first_hundred(gateway)  # at once, without waiting for /ready
    assert backends.count("a100-llamacpp") == 0, backends


async def test_a_fresh_gateway_is_ready_only_once_its_probes_say_where_to_send(
    recovery_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing declared: before the probes answer both candidates are unknown, and the cheap 7 s pool
    # would go first. /ready waits for the API's probe to answer within the SLO.
    with running_gateway(
        recovery_upstreams, tmp_path, monkeypatch, MARGINAL_A100, api_ttft_ms=SLOWER_API_MS
    ) as gateway:
        report: dict[str, Any] = {}
        async with httpx.AsyncClient() as client:
            for _ in range(500):
                answer = await client.get(gateway.url + "/ready")
                report = answer.json()
                if answer.status_code == 200:
                    break
                assert report["start_up_probes"]["done"] is False
                await asyncio.sleep(0.02)
        assert report["ready"] is True and report["start_up_probes"]["routes_waiting"] == []
        backends = await first_hundred(gateway)
    assert backends.count("a100-llamacpp") == 0, backends
