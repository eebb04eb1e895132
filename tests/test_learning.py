"""Routing that learns without spending SLOs, notices recovery, treats rate limits as backpressure and
prices what a request uses: the real gateway in front of the emulators, over HTTP.

The gateway runs on the emulators' clock, so "within 30 s" and the policy's waits are emulated seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sqlite3
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

TIME_SCALE = 0.05
HELLO = [{"role": "user", "content": "Hello there"}]
ROUTES = """
  slo-pool-a100:
    backends: [b300-vllm, a100-llamacpp]
    slo: {ttft_p95_ms: 3000}
  slo-pool-api:
    backends: [b300-vllm, paid-api]
    slo: {ttft_p95_ms: 3000}
  patient:
    backends: [b300-vllm, paid-api]
    exploration: 0
    waiting: {max_wait_s: 300}
  impatient:
    backends: [b300-vllm, paid-api]
    exploration: 0
    waiting: {max_wait_s: 0.5}
  pool-then-api:
    backends: [b300-vllm, paid-api]
    exploration: 0
  vllm-only:
    backends: [b300-vllm]
tuning:
  probes: {interval_s: 5}
"""


@pytest.fixture(scope="module")
def learning_upstreams() -> Iterator[Upstreams]:
    with emulated_upstreams(TIME_SCALE) as up:
        yield up


def start(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edits: dict[str, str] | None = None
) -> Any:
    """The gateway over ``upstreams`` with ROUTES; ``edits`` replace text in the policy first."""
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    text = policy_yaml(upstreams, ROUTES)
    for old, new in (edits or {}).items():
        text = text.replace(old, new)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    options = {"clock": emulated_clock(TIME_SCALE), "rng": random.Random(3), "policy_poll_s": 0.05}
    return running_gateway(path, **options)


def set_faults(server: Any, **faults: Any) -> None:
    httpx.post(server.url + "/emulator/faults", json=faults).raise_for_status()


def complete(gateway: Gateway, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": 16, **extra}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=60)


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(part in line for part in want.split(",")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def candidate(gateway: Gateway, model: str, backend: str) -> dict[str, Any]:
    report = httpx.get(gateway.url + "/admin/explain", params={"model": model}).json()
    found: dict[str, Any] = next(c for c in report["candidates"] if c["backend"] == backend)
    return found


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def _answers_health(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.TransportError:  # refused, or cut by the emulator's listener closing while it loads
        return False


def ledger_rows(gateway: Gateway, table: str = "requests") -> list[dict[str, Any]]:
    runtime = gateway.runtime
    wait_until(lambda: runtime.ledger.pending == 0)
    conn = sqlite3.connect(runtime.ledger.path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()


async def fire(
    gateway: Gateway, model: str, requests: int, concurrency: int, **extra: Any
) -> list[httpx.Response]:
    queue = list(range(requests))
    answers: list[httpx.Response] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            queue.pop()
            body = {"model": model, "messages": HELLO, "max_tokens": 16, **extra}
            answers.append(await client.post(gateway.base_url + "/chat/completions", json=body))

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return answers


async def test_a_candidate_measured_over_the_slo_gets_no_user_traffic_and_stays_measured_by_probes(
    learning_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start(learning_upstreams, tmp_path, monkeypatch) as gateway:
        # Start measured: the A100 (7 s to its first token) is probed at start-up, before any user.
        wait_until(lambda: candidate(gateway, "slo-pool-a100", "a100-llamacpp")["measured"])
        a100 = candidate(gateway, "slo-pool-a100", "a100-llamacpp")
        assert a100["feasible"] is False and any("ttft p95" in why for why in a100["why"])
        probes_before = metric(gateway, "gateway_probes_total", backend="a100-llamacpp")
        answers = await fire(gateway, "slo-pool-a100", requests=1000, concurrency=8)
        assert Counter(r.status_code for r in answers) == Counter({200: 1000})
        assert Counter(r.headers["x-gateway-backend"] for r in answers) == Counter({"b300-vllm": 1000})
        assert not any(r.headers["x-gateway-decision"] == "exploration" for r in answers)
        # Its stats stayed fresh all along, from probes only, and the metrics say so.
        assert metric(gateway, "gateway_probes_total", backend="a100-llamacpp") > probes_before
        view = gateway.runtime.stats.view("a100-llamacpp")
        assert view.last_probe_at is not None and view.last_user_sample_at is None
        assert gateway.runtime.clock() - view.last_probe_at < 30
        assert metric(gateway, "gateway_requests_total", backend="a100-llamacpp") == 0
        probes = ledger_rows(gateway, "probes")
        assert probes and {row["route"] for row in probes} == {""} and all(row["probe"] for row in probes)
        assert all(row["api_key_name"] is None for row in probes)
        assert "a100-llamacpp" not in {row["backend"] for row in ledger_rows(gateway)}


async def test_a_rate_limited_api_in_front_of_full_pools_is_backpressure_not_failure(
    learning_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool of two that is already paid for (marginal), then an API that rate-limits everything.
    pool = "    timeouts: {first_byte_s: 5, idle_s: 2}\n  a100"
    with start(
        learning_upstreams, tmp_path, monkeypatch, {pool: "    max_concurrency: 2\n" + pool}
    ) as gateway:
        wait_until(lambda: gateway.runtime.probes.idle)
        set_faults(learning_upstreams.paid, rate_limit_rpm=1)
        complete(gateway, "patient")  # may spend the API's one request of the minute
        answers = await fire(gateway, "patient", requests=40, concurrency=8, max_tokens=200)
        assert Counter(r.status_code for r in answers) == Counter({200: 40}), "nobody failed while waiting"
        waited = [r for r in answers if "x-gateway-queued-s" in r.headers]
        # The decision header says it waited (or, when the API's 429 came after the wait, the fallback).
        said = [r.headers["x-gateway-decision"] for r in waited]
        assert said and all(d.endswith("_after_wait") or d.startswith("fallback_after_") for d in said), said
        assert any(d.endswith("_after_wait") for d in said)
        assert metric(gateway, "gateway_backend_circuit_state", backend="paid-api") == 0, (
            "429s open no circuit"
        )
        assert metric(gateway, "gateway_queued_requests_total", route="patient", outcome="served") > 0
        assert any(row["queued_s"] > 0 for row in ledger_rows(gateway))

        # Past the route's bound: 429 with Retry-After, never 502 or 503.
        impatient = await fire(gateway, "impatient", requests=40, concurrency=8, max_tokens=200)
        statuses = Counter(r.status_code for r in impatient)
        assert set(statuses) <= {200, 429} and statuses[429] > 0, statuses
        refused = next(r for r in impatient if r.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "backends_busy"

        # The limit ends: the API takes traffic again at once (no circuit to wait out).
        set_faults(learning_upstreams.paid, rate_limit_rpm=None)
        await asyncio.sleep(0.1)  # any pause left by the last 429 (its Retry-After) runs out
        after = await fire(gateway, "patient", requests=16, concurrency=8, max_tokens=200)
        assert Counter(r.status_code for r in after) == Counter({200: 16})
        assert any(r.headers["x-gateway-backend"] == "paid-api" for r in after)


def _first_pool_request_after(gateway: Gateway, model: str, since: float, limit_s: float = 60.0) -> float:
    """Emulated seconds from ``since`` until a user request is answered by the pool."""
    while gateway.runtime.clock() - since < limit_s:
        response = complete(gateway, model, stream=False)
        assert response.status_code == 200, response.text
        if response.headers["x-gateway-backend"] == "b300-vllm":
            return gateway.runtime.clock() - since
    raise AssertionError(f"no user request reached the pool within {limit_s} emulated seconds")


def test_a_pool_gets_user_traffic_again_soon_after_it_recovers_and_after_a_cold_boot(
    learning_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start(learning_upstreams, tmp_path, monkeypatch) as gateway:
        wait_until(lambda: gateway.runtime.probes.idle)
        assert complete(gateway, "slo-pool-api").headers["x-gateway-backend"] == "b300-vllm"
        set_faults(learning_upstreams.vllm, added_ttft_ms=4000)  # TTFT ~5 s against a 3 s SLO
        moved = [complete(gateway, "slo-pool-api").headers["x-gateway-backend"] for _ in range(20)]
        assert moved[-5:] == ["paid-api"] * 5
        time.sleep(0.5)  # a slow spell of 10 emulated seconds, measured by probes only
        assert candidate(gateway, "slo-pool-api", "b300-vllm")["feasible"] is False

        set_faults(learning_upstreams.vllm, added_ttft_ms=0)
        recovered_at = gateway.runtime.clock()
        assert _first_pool_request_after(gateway, "slo-pool-api", recovered_at) <= 30.0

        # A restart: 60 emulated seconds in which vLLM refuses connections (it listens once loaded).
        set_faults(learning_upstreams.vllm, cold_boot_s=60)
        wait_until(lambda: candidate(gateway, "slo-pool-api", "b300-vllm")["eligible"] is False)
        wait_until(lambda: _answers_health(learning_upstreams.vllm.url))
        booted_at = gateway.runtime.clock()
        assert _first_pool_request_after(gateway, "slo-pool-api", booted_at) <= 30.0


def test_a_long_prompt_on_a_pool_costs_its_prefill(
    learning_upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start(learning_upstreams, tmp_path, monkeypatch) as gateway:
        set_faults(learning_upstreams.vllm, reasoning_tokens=50, content_tokens=50)
        wait_until(lambda: gateway.runtime.probes.idle)
        short = [{"role": "user", "content": "word " * 200}]
        long = [{"role": "user", "content": "word " * 200_000}]
        for messages in (short, long, short):
            assert complete(gateway, "vllm-only", messages=messages, max_tokens=100).status_code == 200
        rows = ledger_rows(gateway)[-2:]
        long_row, short_row = rows[0], rows[1]
        assert long_row["prompt_tokens"] > 100 * short_row["prompt_tokens"]
        assert long_row["completion_tokens"] == short_row["completion_tokens"]
        assert long_row["cost_usd"] > 1.5 * short_row["cost_usd"], (long_row, short_row)
        assert long_row["prefill_cost_usd"] > 100 * short_row["prefill_cost_usd"] > 0
        output_share = short_row["cost_usd"] - short_row["prefill_cost_usd"]
        assert long_row["cost_usd"] == pytest.approx(long_row["prefill_cost_usd"] + output_share, rel=0.2)


def test_an_upstream_503_then_a_fallback_says_so(
    learning_upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with start(learning_upstreams, tmp_path, monkeypatch) as gateway:
        # The start-up probes first, or one of them meets the 503 before the user's request does.
        wait_until(lambda: gateway.runtime.probes.idle)
        set_faults(learning_upstreams.vllm, error_rate=1.0, error_status=503)
        with caplog.at_level(logging.WARNING, logger="gateway"):
            response = complete(gateway, "pool-then-api")
        assert response.status_code == 200
        assert response.headers["x-gateway-backend"] == "paid-api"
        assert response.headers["x-gateway-decision"] == "fallback_after_upstream_error"
        assert response.headers["x-gateway-attempts"] == "2"
        request_id = response.headers["x-request-id"]
        row = next(r for r in ledger_rows(gateway) if r["request_id"] == request_id)
        assert row["attempts"] == 2 and row["decision_reason"] == "fallback_after_upstream_error"
        log = [(a["backend"], a["status"], a["http_status"]) for a in json.loads(row["attempt_log"])]
        assert log == [("b300-vllm", "upstream_error", 503), ("paid-api", "ok", None)]
        logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("b300-vllm" in m and "503" in m and request_id in m for m in logged), logged
