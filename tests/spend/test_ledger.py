"""The ledger: one row per request with who, where, tokens, cost and timings; written in batches off the
request path; complete after a SIGTERM under load; carried over a restart."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.ledger import Ledger, LedgerRow
from gateway.policy.reload import PolicyHolder
from gateway.runtime import Runtime
from tests.conftest import PAID_KEY, Gateway, Upstreams
from tests.servers import ProcessServer, free_port, python_module, threaded_server, wait_http

from .conftest import HELLO, MakeGateway, chat, ledger_path, ledger_rows, settle, spend_policy

ROUTES = """
  kimi-k3:
    backends: [b300-vllm, paid-api]
    exploration: 0
  vllm-only:
    backends: [b300-vllm]
  llamacpp-only:
    backends: [a100-llamacpp]
    fallback: {max_attempts: 1}
  paid-only:
    backends: [paid-api]
"""


def set_faults(server: object, **faults: object) -> None:
    httpx.post(f"{server.url}/emulator/faults", json=faults).raise_for_status()  # type: ignore[attr-defined]


def test_each_request_gets_a_row_with_tokens_cost_and_timings(
    make_gateway: MakeGateway, upstreams: Upstreams, tmp_path: Path
) -> None:
    gateway = make_gateway(ROUTES)
    plain = chat(gateway, "paid-only", headers={"x-request-id": "req-plain"})
    stream = chat(gateway, "vllm-only", stream=True, stream_options={"include_usage": True})
    set_faults(upstreams.llamacpp, omit_stream_usage=True)
    counted = chat(gateway, "llamacpp-only", stream=True)
    assert plain.status_code == stream.status_code == counted.status_code == 200
    settle(gateway, 3)

    first, second, third = ledger_rows(ledger_path(tmp_path))
    usage = plain.json()["usage"]
    assert first["request_id"] == plain.headers["x-request-id"]
    assert (first["route"], first["backend"], first["upstream_model"]) == ("paid-only", "paid-api", "kimi-k3")
    assert first["prompt_tokens"] == usage["prompt_tokens"]
    assert first["completion_tokens"] == usage["completion_tokens"]
    assert first["reasoning_tokens"] == usage["completion_tokens_details"]["reasoning_tokens"] > 0
    assert first["usage_source"] == "reported" and first["cost_basis"] == "per_token"
    assert first["cost_usd"] == pytest.approx(float(plain.headers["x-gateway-cost-usd"]), abs=1e-8)
    assert first["cost_usd"] == pytest.approx(
        (usage["prompt_tokens"] - first["cached_prompt_tokens"]) * 0.6e-6
        + first["cached_prompt_tokens"] * 0.15e-6
        + usage["completion_tokens"] * 15e-6
    )
    assert first["status"] == "ok" and first["error_type"] is None and first["attempts"] == 1
    assert first["decision_reason"] == plain.headers["x-gateway-decision"]
    assert first["api_key_name"] is None and first["endpoint"] == "chat" and first["stream"] == 0

    assert second["stream"] == 1 and second["backend"] == "b300-vllm"
    assert 0 < second["ttft_s"] <= second["first_answer_s"] <= second["duration_s"]
    assert second["decode_tokens_per_s"] > 0
    assert second["cost_basis"].startswith("gpu_hours")
    assert third["usage_source"] == "counted" and third["completion_tokens"] > 0


def test_failures_and_fallbacks_are_rows_too(
    make_gateway: MakeGateway, upstreams: Upstreams, tmp_path: Path
) -> None:
    gateway = make_gateway(ROUTES)
    set_faults(upstreams.vllm, error_rate=1.0, error_status=503)
    fell_back = chat(gateway, "kimi-k3")
    failed = chat(gateway, "vllm-only")
    assert (fell_back.status_code, failed.status_code) == (200, 502)
    settle(gateway, 2)
    rescued, lost = ledger_rows(ledger_path(tmp_path))
    assert (rescued["attempts"], rescued["backend"], rescued["status"]) == (2, "paid-api", "ok")
    assert rescued["cost_usd"] > 0
    assert (lost["status"], lost["error_type"], lost["cost_usd"]) == ("error", "upstream_failed", 0.0)
    assert lost["attempts"] >= 1 and lost["completion_tokens"] == 0


def row(n: int) -> LedgerRow:
    return LedgerRow(
        time=float(n),
        request_id=f"r{n}",
        api_key_name=None,
        route="route",
        endpoint="chat",
        stream=False,
        backend="b",
        upstream_model="m",
        prompt_tokens=1,
        cached_prompt_tokens=0,
        completion_tokens=2,
        reasoning_tokens=1,
        usage_source="reported",
        cost_usd=0.5,
        cost_basis="per_token",
        reserved_usd=None,
        ttft_s=None,
        first_answer_s=None,
        decode_tokens_per_s=None,
        duration_s=0.1,
        status="ok",
        error_type=None,
        attempts=1,
        decision_reason="only_candidate",
    )


async def test_rows_wait_for_a_full_batch_or_the_interval_and_close_writes_the_rest(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3", flush_interval_s=3600, batch_size=3)
    await ledger.start()
    ledger.append(row(1))
    ledger.append(row(2))
    await asyncio.sleep(0.2)
    assert ledger.rows_written == 0, "appending does no I/O: a part batch waits for the interval"
    ledger.append(row(3))
    assert await ledger.flush()
    assert ledger.rows_written == 3, "a full batch wakes the writer"
    ledger.append(row(4))
    await ledger.close()
    assert [r["request_id"] for r in ledger_rows(tmp_path / "ledger.sqlite3")] == ["r1", "r2", "r3", "r4"]


async def test_an_unwritable_ledger_fails_at_start_not_on_a_request(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="cannot open the ledger"):
        await Ledger(blocker / "ledger.sqlite3").start()


def test_a_restart_carries_todays_spend_and_budget_counters(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    routes = ROUTES + "    budgets: {per_day_usd: 100, per_month_usd: 1000}\n"
    path = tmp_path / "policy.yaml"
    path.write_text(spend_policy(upstreams, ledger_path(tmp_path), routes))
    for run in range(2):
        app = create_app(functools.partial(Runtime, PolicyHolder(path)))
        with threaded_server(app) as server:
            gateway = Gateway(server, path)
            for _ in range(3):
                assert chat(gateway, "paid-only").status_code == 200
            settle(gateway, 3)
            rows = ledger_rows(ledger_path(tmp_path), "route = 'paid-only'")
            assert len(rows) == 3 * (run + 1)
            total = sum(r["cost_usd"] for r in rows)
            runtime = gateway.runtime
            uses = runtime.budgets.usage(runtime.policy, runtime.wall_clock())
            assert {u.period: round(u.spent_usd, 12) for u in uses} == {
                "day": round(total, 12),
                "month": round(total, 12),
            }
            today_usd, today_requests = runtime.spend.today(runtime.wall_clock())["paid-only"]
            assert (round(today_usd, 12), today_requests) == (round(total, 12), 3 * (run + 1))


class Load:
    """Workers sending requests with known ids until the gateway stops answering."""

    def __init__(self, url: str, workers: int) -> None:
        self.url = url
        self.workers = workers
        self.completed: list[str] = []
        self.failed = 0
        self.sent = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.workers)))

    async def _worker(self, client: httpx.AsyncClient, worker: int) -> None:
        for n in range(1000):
            request_id = f"w{worker}-{n}"
            self.sent += 1
            body = {"model": "vllm-only", "messages": HELLO, "stream": n % 2 == 0}
            try:
                async with client.stream(
                    "POST", self.url, json=body, headers={"x-request-id": request_id}
                ) as response:
                    text = (await response.aread()).decode()
            except httpx.HTTPError:
                self.failed += 1
                return  # the gateway has stopped listening
            complete = response.status_code == 200 and (not body["stream"] or "data: [DONE]" in text)
            if complete:
                self.completed.append(request_id)


@pytest.mark.slow
def test_every_answered_request_has_its_row_after_a_sigterm_under_load(
    upstreams: Upstreams, tmp_path: Path
) -> None:
    set_faults(upstreams.vllm, slowdown=25)  # each request takes a good fraction of a second
    policy = tmp_path / "policy.yaml"
    policy.write_text(spend_policy(upstreams, ledger_path(tmp_path), ROUTES))
    port = free_port()
    server = ProcessServer(
        python_module("gateway", "serve", "--policy", str(policy), "--port", str(port)),
        env={"TEST_PAID_API_KEY": PAID_KEY},
        log_path=str(tmp_path / "gateway.log"),
    ).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        load = Load(f"http://127.0.0.1:{port}/v1/chat/completions", workers=32)
        thread = threading.Thread(target=asyncio.run, args=(load.run(),))
        thread.start()
        deadline = time.monotonic() + 60
        while len(load.completed) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        answered_before = len(load.completed)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        thread.join(timeout=60)
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        upstreams.reset()
    assert answered_before >= 40
    assert len(load.completed) > answered_before, "requests in flight at the SIGTERM were finished"
    ids = {r["request_id"] for r in ledger_rows(ledger_path(tmp_path))}
    missing = set(load.completed) - ids
    assert not missing, f"{len(missing)} answered requests have no ledger row: {sorted(missing)[:5]}"
    log = (tmp_path / "gateway.log").read_text()
    assert "unwritten" not in log
