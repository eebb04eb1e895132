"""Cost-aware routing against the emulators over real HTTP: live prices come out of live measurement,
traffic follows the SLO and comes back, a dying backend costs no request, policy edits apply live.

The gateway runs on the emulators' clock (``emulated_clock``), so what it measures is in the same
emulated seconds as the published figures the emulators reproduce.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import (
    PAID_KEY,
    Gateway,
    Upstreams,
    emulated_clock,
    emulated_upstreams,
    policy_yaml,
    running_gateway,
)
from tests.servers import ProcessServer, free_port, python_module, wait_http

TIME_SCALE = 0.05
HELLO = [{"role": "user", "content": "Hello there"}]
ROUTES = """
  kimi-k3:
    backends: [b300-vllm, paid-api, a100-llamacpp]
    slo: {ttft_p95_ms: 3000, min_decode_tokens_per_s: 20}
    exploration: 0.1
  vllm-only:
    backends: [b300-vllm]
  llamacpp-only:
    backends: [a100-llamacpp]
"""


@pytest.fixture(scope="module")
def slow_upstreams() -> Iterator[Upstreams]:
    """Emulators at a gentler time scale than the session's, so measured rates are precise to ~1%."""
    with emulated_upstreams(TIME_SCALE) as up:
        yield up


@pytest.fixture
def routed(slow_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    slow_upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(slow_upstreams, ROUTES))
    options = {"clock": emulated_clock(TIME_SCALE), "rng": random.Random(7), "policy_poll_s": 0.05}
    with running_gateway(path, **options) as gateway:
        _wait(lambda: gateway.runtime.probes.idle)  # it starts measured: each backend probed once
        yield gateway
    slow_upstreams.reset()


def stream_once(gateway: Gateway, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "stream": True, **extra}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=60) as response:
        response.read()
    assert response.status_code == 200, response.text
    return response


def explain(gateway: Gateway, model: str) -> dict[str, Any]:
    response = httpx.get(gateway.url + "/admin/explain", params={"model": model})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def candidate(report: dict[str, Any], backend: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in report["candidates"] if c["backend"] == backend)
    return found


def set_faults(server: Any, **faults: Any) -> None:
    httpx.post(server.url + "/emulator/faults", json=faults).raise_for_status()


@pytest.mark.parametrize(
    ("route", "backend", "published_usd_per_mtok", "published_tokens_per_s"),
    [("vllm-only", "b300-vllm", 190.0, 92.0), ("llamacpp-only", "a100-llamacpp", 620.0, 9.0)],
)
def test_published_prices_come_out_of_live_measurement(
    routed: Gateway,
    slow_upstreams: Upstreams,
    route: str,
    backend: str,
    published_usd_per_mtok: float,
    published_tokens_per_s: float,
) -> None:
    # Long enough answers that scheduling jitter on a busy machine stays well under the 5% asked.
    set_faults(slow_upstreams.vllm, content_tokens=600)
    before = candidate(explain(routed, route), backend)
    # A start-up probe measures TTFT only (max_tokens 1): the price waits for real decoding.
    assert before["usd_per_mtok_out"] is None
    for _ in range(3):
        stream_once(routed, route)
    measured = candidate(explain(routed, route), backend)
    assert measured["measured"] is True
    assert measured["decode_tokens_per_s"] == pytest.approx(published_tokens_per_s, rel=0.05)
    assert measured["usd_per_mtok_out"] == pytest.approx(published_usd_per_mtok, rel=0.05)


def test_traffic_follows_the_slo_and_comes_back(routed: Gateway, slow_upstreams: Upstreams) -> None:
    def backend_of_next() -> str:
        return stream_once(routed, "kimi-k3", max_tokens=24).headers["x-gateway-backend"]

    assert explain(routed, "kimi-k3")["choice"] == "b300-vllm", (
        "an idle, already-paid pool costs nothing more"
    )
    light = [stream_once(routed, "kimi-k3", max_tokens=24) for _ in range(10)]
    decided = [r for r in light if r.headers["x-gateway-decision"] != "exploration"]
    assert decided, "exploration is a small share"
    went = [(r.headers["x-gateway-backend"], r.headers["x-gateway-decision"]) for r in decided]
    assert all(backend == "b300-vllm" for backend, _ in went), f"the rest goes to the pool: {went}"
    assert decided[-1].headers["x-gateway-decision"] == "cheapest_within_slo"
    assert float(decided[-1].headers["x-gateway-cost-usd"]) == 0.0, "marginal cost of a pool with headroom"

    set_faults(slow_upstreams.vllm, added_ttft_ms=4000)  # TTFT ~5 s against a 3 s SLO
    moved = [backend_of_next() for _ in range(30)]
    assert Counter(moved[-10:]).most_common(1)[0][0] == "paid-api"
    b300 = candidate(explain(routed, "kimi-k3"), "b300-vllm")
    assert b300["feasible"] is False and any("ttft p95" in why for why in b300["why"])

    set_faults(slow_upstreams.vllm, added_ttft_ms=0)
    deadline = time.monotonic() + 60
    recent: list[str] = []
    while time.monotonic() < deadline:
        recent = [*recent[-9:], backend_of_next()]
        if recent.count("b300-vllm") >= 8:
            break
    assert recent.count("b300-vllm") >= 8, f"traffic did not move back: {recent}"


async def test_a_backend_dying_mid_run_fails_no_request(
    slow_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    doomed = ProcessServer(
        python_module(
            "gateway", "emulate", "--profile", "b300-vllm", "--port", str(port), "--time-scale", "0.05"
        )
    ).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
        text = policy_yaml(slow_upstreams, "\n  kimi-k3:\n    backends: [b300-vllm, paid-api]\n")
        path = tmp_path / "policy.yaml"
        path.write_text(text.replace(slow_upstreams.vllm.url, f"http://127.0.0.1:{port}"))
        with running_gateway(path, clock=emulated_clock(TIME_SCALE)) as gateway:
            statuses, backends = await _load_while_killing(gateway, doomed, requests=60, concurrency=8)
    finally:
        doomed.stop()
    assert statuses == Counter({200: 60}), "no client saw the backend die"
    assert backends["b300-vllm"] > 0 and backends["paid-api"] > 0


async def _load_while_killing(
    gateway: Gateway, doomed: ProcessServer, *, requests: int, concurrency: int
) -> tuple[Counter[int], Counter[str]]:
    statuses: Counter[int] = Counter()
    backends: Counter[str] = Counter()
    queue = list(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            queue.pop()
            body = {"model": "kimi-k3", "messages": HELLO, "max_tokens": 64}
            response = await client.post(gateway.base_url + "/chat/completions", json=body)
            statuses[response.status_code] += 1
            backends[response.headers.get("x-gateway-backend", "")] += 1
            if sum(statuses.values()) == requests // 4:
                doomed.stop(timeout=0.1)  # SIGTERM by pid while requests are in flight on it

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return statuses, backends


def test_a_policy_edit_applies_without_restart_and_a_bad_one_is_rejected(routed: Gateway) -> None:
    path = routed.policy_path
    good = path.read_text()
    path.write_text(good + "  paid-only:\n    backends: [paid-api]\n")
    _wait(lambda: "paid-only" in _model_ids(routed))
    assert stream_once(routed, "paid-only").headers["x-gateway-backend"] == "paid-api"

    broken = path.read_text().replace("exploration: 0.1", "exploration: 0.1\n    colour: blue")
    path.write_text(broken)
    _wait(lambda: httpx.get(routed.url + "/admin/policy").json()["last_error"] is not None)
    status = httpx.get(routed.url + "/admin/policy").json()
    line = broken.splitlines().index("    colour: blue") + 1
    assert f"{path}:{line}:5 routes.kimi-k3.colour" in status["last_error"]
    assert status["reload_failures"] == 1
    assert stream_once(routed, "paid-only").status_code == 200, "the last good policy keeps serving"


def test_explain_sends_nothing_upstream(routed: Gateway, slow_upstreams: Upstreams) -> None:
    httpx.delete(slow_upstreams.vllm.url + "/emulator/requests")
    report = explain(routed, "kimi-k3")
    assert report["choice"] in {"b300-vllm", "paid-api", "a100-llamacpp"}
    assert {c["backend"] for c in report["candidates"]} == {"b300-vllm", "paid-api", "a100-llamacpp"}
    assert all({"feasible", "why", "usd_per_mtok_out", "ttft_p95_s"} <= set(c) for c in report["candidates"])
    assert httpx.get(slow_upstreams.vllm.url + "/emulator/requests").json() == []
    unknown = httpx.get(routed.url + "/admin/explain", params={"model": "nope"})
    assert unknown.status_code == 404


def test_circuit_opens_on_a_single_backend_route_and_closes_after_recovery(
    routed: Gateway, slow_upstreams: Upstreams
) -> None:
    set_faults(slow_upstreams.llamacpp, error_rate=1.0)
    body = {"model": "llamacpp-only", "messages": HELLO}
    statuses = [
        httpx.post(routed.base_url + "/chat/completions", json=body, timeout=30).status_code for _ in range(8)
    ]
    # Five failures in a row open the circuit; a probe that failed meanwhile counts among them.
    assert 503 in statuses, "an open circuit refuses at once instead of hammering the backend"
    opened = statuses.index(503)
    # (Up to six: a probe sent before the fault that answers after a failure resets the count once.)
    assert 1 <= opened <= 6 and statuses[:opened] == [502] * opened
    set_faults(slow_upstreams.llamacpp, error_rate=0.0)
    _wait(lambda: httpx.post(routed.base_url + "/chat/completions", json=body, timeout=30).status_code == 200)


def test_a_booting_backend_gets_no_traffic(
    slow_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    booting = ProcessServer(
        python_module(
            "gateway",
            "emulate",
            "--profile",
            "b300-vllm",
            "--port",
            str(port),
            "--time-scale",
            "0.05",
            "--cold-boot",
        )
    ).start()
    try:
        # vLLM does not listen while it loads: nothing to wait for, the gateway meets refused connections.
        monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
        text = policy_yaml(slow_upstreams, "\n  kimi-k3:\n    backends: [b300-vllm, paid-api]\n")
        path = tmp_path / "policy.yaml"
        path.write_text(text.replace(slow_upstreams.vllm.url, f"http://127.0.0.1:{port}"))
        with running_gateway(path, clock=emulated_clock(TIME_SCALE)) as gateway:
            _wait(lambda: candidate(explain(gateway, "kimi-k3"), "b300-vllm")["eligible"] is False)
            assert "booting" in " ".join(candidate(explain(gateway, "kimi-k3"), "b300-vllm")["why"])
            for _ in range(5):
                assert stream_once(gateway, "kimi-k3").headers["x-gateway-backend"] == "paid-api"
    finally:
        booting.stop()


def _model_ids(gateway: Gateway) -> set[str]:
    return {m["id"] for m in httpx.get(gateway.base_url + "/models").json()["data"]}


def _wait(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
