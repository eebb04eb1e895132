"""The fault matrix: one upstream fault per case, on the first backend of a two-backend route. Before
the client has a byte the gateway falls back to the healthy backend; after it, the stream ends with a
clean SSE error event. Either way the ledger has the request's row, the metrics and the circuit count
the failed attempt, and no task, open stream, budget reservation or socket is left behind."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.reliability.faulty_upstream import (
    FRAMES_BEFORE_FAULT,
    RETRY_AFTER_S,
    FaultyUpstream,
    faulty_upstream,
)
from tests.conftest import Gateway, Upstreams, running_gateway
from tests.faults.sockets import Connection, connections_to, held_connections
from tests.servers import free_port

FALLBACK, MID_STREAM = "fallback", "error event"


@dataclass(frozen=True)
class Case:
    name: str
    stream: bool
    client_sees: str  # FALLBACK or MID_STREAM
    error_type: str  # the metric's type label for the failed attempt
    raw: str | None = None  # the raw upstream's mode, or
    knobs: dict[str, Any] = field(default_factory=dict)  # the llama.cpp emulator's fault knobs
    # Connections to the faulty upstream the gateway may keep open after: one, pooled for reuse, when
    # its answer was a whole HTTP response; none when the answer broke (a broken one is never reused).
    pooled: int = 0


CASES = [
    Case(
        "upstream 500", False, FALLBACK, "http_5xx", knobs={"error_rate": 1.0, "error_status": 500}, pooled=1
    ),
    Case("429 with Retry-After", True, FALLBACK, "http_429", raw="http_429", pooled=1),
    Case("connection refused", True, FALLBACK, "upstream_error", raw="refused"),
    Case("connection reset", False, FALLBACK, "upstream_error", raw="reset"),
    Case("hang before the first byte", True, FALLBACK, "timeout", knobs={"hang": True}),
    Case("hang mid-stream", True, MID_STREAM, "timeout", raw="hang_mid_stream"),
    Case("death mid-stream", True, MID_STREAM, "dropped", knobs={"drop_after_chunks": 3}),
    Case("garbage bytes in the SSE stream", True, MID_STREAM, "dropped", raw="garbage_sse"),
    Case("truncated JSON answer", False, FALLBACK, "upstream_error", raw="truncated_json"),
    Case("one byte per second", True, FALLBACK, "timeout", raw="trickle"),
    Case(
        "200 with an OpenAI error body", False, FALLBACK, "upstream_error", raw="ok_with_error_body", pooled=1
    ),
]


@pytest.fixture(scope="module")
def raw_upstream() -> Iterator[FaultyUpstream]:
    with faulty_upstream() as upstream:
        yield upstream


def policy(faulty_url: str, dialect: str, good_url: str) -> str:
    return f"""
backends:
  faulty:
    dialect: {dialect}
    url: {faulty_url}/v1
    model: kimi-k3-ud-iq1_s
    pricing: {{gpu_hours: {{usd_per_hour: 1.0}}}}
    timeouts: {{first_byte_s: 1.5, idle_s: 1.5, answer_s: 5}}
  good:
    dialect: vllm
    url: {good_url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    timeouts: {{first_byte_s: 10, idle_s: 5}}
routes:
  kimi-k3:
    backends: [faulty, good]
    exploration: 0
    budgets: {{per_day_usd: 1000}}
ledger: {{flush_interval_s: 0.05}}
tuning:
  circuit: {{failure_threshold: 1, base_cooldown_s: 600, max_cooldown_s: 600}}
  # A start-up probe would meet the fault first (and open the circuit): users' requests must.
  probes: {{enabled: false}}
"""


def loop_of(gateway: Gateway) -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop = gateway.server.server.servers[0].get_loop()
    return loop


def tasks_in(gateway: Gateway) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())

    return asyncio.run_coroutine_threadsafe(count(), loop_of(gateway)).result(10)


def reserved_usd(gateway: Gateway) -> float:
    runtime = gateway.runtime
    return sum(use.reserved_usd for use in runtime.budgets.usage(runtime.policy, runtime.wall_clock()))


def upstream_errors(gateway: Gateway, error_type: str) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    wanted = f'gateway_upstream_errors_total{{backend="faulty",type="{error_type}"}} '
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def settled(gateway: Gateway, baseline_tasks: int, rows: int) -> tuple[int, int]:
    """Wait (bounded) for the request to finish everywhere: its tasks gone, its ledger row written."""
    deadline = time.monotonic() + 15
    while True:
        tasks, written = tasks_in(gateway), gateway.runtime.ledger.rows_written
        if (tasks <= baseline_tasks and written >= rows) or time.monotonic() > deadline:
            return tasks, written
        time.sleep(0.05)


def ask(gateway: Gateway, stream: bool) -> tuple[httpx.Response, str]:
    payload = {
        "model": "kimi-k3",
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,
    }
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=payload, timeout=60) as response:
        return response, response.read().decode(errors="replace")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault(case: Case, upstreams: Upstreams, raw_upstream: FaultyUpstream, tmp_path: Path) -> None:
    upstreams.reset()
    if case.raw is None:
        faulty_url, dialect = upstreams.llamacpp.url, "llamacpp"
        httpx.post(upstreams.llamacpp.url + "/emulator/faults", json=case.knobs).raise_for_status()
    elif case.raw == "refused":
        faulty_url, dialect = f"http://127.0.0.1:{free_port()}", "vllm"
    else:
        faulty_url, dialect = raw_upstream.url, "vllm"
        raw_upstream.mode = case.raw
    path = tmp_path / "policy.yaml"
    path.write_text(policy(faulty_url, dialect, upstreams.vllm.url))
    try:
        with running_gateway(path) as gateway:
            ask_and_check(gateway, case)
            check_no_socket_leaks(gateway, case, port_of(faulty_url), port_of(upstreams.vllm.url))
    finally:
        upstreams.reset()
        raw_upstream.mode = "ok"


def ask_and_check(gateway: Gateway, case: Case) -> None:
    baseline_tasks = tasks_in(gateway)
    response, body = ask(gateway, case.stream)

    # What the client sees.
    assert response.status_code == 200, body
    if case.client_sees == FALLBACK:
        assert response.headers["x-gateway-backend"] == "good", "fell back before the first byte"
        if case.stream:
            assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body, body[-300:]
        else:
            assert "error" not in response.json() and response.json()["choices"], body
    else:
        assert response.headers["x-gateway-backend"] == "faulty"
        events = [e for e in body.split("\n\n") if e.strip()]
        assert len(events) > FRAMES_BEFORE_FAULT - 1, "tokens reached the client before the fault"
        assert events[-1].startswith("data: {") and '"error"' in events[-1], events[-3:]
        assert "[DONE]" not in body, "an error event, not a normal end"
        assert "not json" not in body and "garbage" not in body, "no corrupt event reaches the client"

    # What the ledger, the metrics and the circuit record.
    tasks, written = settled(gateway, baseline_tasks, rows=1)
    assert written == 1
    runtime = gateway.runtime
    with contextlib.closing(sqlite3.connect(gateway.policy_path.parent / "ledger.sqlite3")) as db:
        rows = list(db.execute("SELECT backend, status, attempts FROM requests"))
    if case.client_sees == FALLBACK:
        assert rows == [("good", "ok", 2)]
    else:
        assert rows == [("faulty", "error", 1)]
    counted = [
        line
        for line in httpx.get(gateway.url + "/metrics").text.splitlines()
        if "upstream_errors_total{" in line
    ]
    assert upstream_errors(gateway, case.error_type) == 1.0, counted
    if case.error_type == "http_429":
        # A rate limit is backpressure, not failure: the backend is paused, its circuit untouched.
        view = runtime.stats.view("faulty")
        assert view.circuit == "closed" and view.paused_until is not None
    else:
        assert runtime.stats.view("faulty").circuit == "open", "one failure opens it (failure_threshold: 1)"
    assert runtime.stats.view("good").circuit == "closed"

    # Nothing leaks: tasks, open streams, reservations.
    assert tasks <= baseline_tasks, f"{tasks - baseline_tasks} tasks left behind"
    assert not runtime.drain.streams
    assert reserved_usd(gateway) == pytest.approx(0.0, abs=1e-12)


def test_429_on_the_only_backend_passes_its_retry_after_on(
    raw_upstream: FaultyUpstream, tmp_path: Path
) -> None:
    """With nowhere to fall back, the client's error carries the upstream's Retry-After, and the
    request is still settled: its ledger row, no reservation left."""
    raw_upstream.mode = "http_429"
    path = tmp_path / "policy.yaml"
    path.write_text(
        policy(raw_upstream.url, "vllm", raw_upstream.url).replace(
            "backends: [faulty, good]", "backends: [faulty]"
        )
    )
    try:
        with running_gateway(path) as gateway:
            baseline_tasks = tasks_in(gateway)
            response, body = ask(gateway, stream=True)
            # Backpressure (issue 13): the route waits within its bound for the pause to end, then
            # answers 429 with the time the upstream's Retry-After has left.
            assert response.status_code == 429, body
            retry_after = int(response.headers["retry-after"])
            assert 1 <= retry_after <= int(RETRY_AFTER_S), dict(response.headers)
            assert response.json()["error"]["type"], body
            tasks, written = settled(gateway, baseline_tasks, rows=1)
            assert written == 1 and tasks <= baseline_tasks
            assert reserved_usd(gateway) == pytest.approx(0.0, abs=1e-12)
    finally:
        raw_upstream.mode = "ok"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def check_no_socket_leaks(gateway: Gateway, case: Case, faulty_port: int, good_port: int) -> None:
    """The gateway's side of every connection, by file descriptor (the upstreams and the client run in
    this process too, but only the gateway connects to the upstreams' ports or is connected to on its
    own): the broken answer's connection is closed, the healthy backend keeps at most its one pooled
    connection, and the client's connection, closed by the client, is closed by the gateway too."""
    gateway_port = port_of(gateway.url)

    def held() -> tuple[list[Connection], list[Connection], list[Connection]]:
        inbound = [c for c in held_connections() if c.local_port == gateway_port and c.state != "LISTEN"]
        return connections_to(faulty_port), connections_to(good_port), inbound

    deadline = time.monotonic() + 10  # closing is asynchronous: bound the wait, not the time it takes
    while True:
        faulty, good, inbound = held()
        within = len(faulty) <= case.pooled and len(good) <= 1 and not inbound
        if within or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(faulty) <= case.pooled, f"connections to the faulty upstream left open: {faulty}"
    assert all(c.state == "ESTABLISHED" for c in faulty), f"a pooled connection is a live one: {faulty}"
    assert len(good) <= 1, f"more than the one pooled connection to the healthy backend: {good}"
    assert not inbound, f"the client's connection is still open on the gateway's side: {inbound}"
