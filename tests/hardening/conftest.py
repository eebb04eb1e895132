"""A real ``gateway serve`` process on a loopback port over an emulated pool, with the server limits a
test sets: the slow-client and overload tests need the process's own HTTP protocol and its own memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.emulator import create_emulator_app
from tests.servers import ProcessServer, ThreadedServer, free_port, python_module, threaded_server, wait_http


@dataclass
class ServedGateway:
    process: ProcessServer
    url: str
    log: Path

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def ready(self) -> dict[str, Any]:
        """/ready's body (its status may be 503 while a backend is down; the body says why)."""
        body: dict[str, Any] = httpx.get(self.url + "/ready", timeout=30).json()
        return body


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadedServer]:
    """A vLLM pool emulated at a tenth of real time: a request of 30 tokens takes ~0.1 s to decode."""
    with threaded_server(create_emulator_app("b300-vllm", time_scale=0.1)) as server:
        yield server


def pool_policy(pool: ThreadedServer, server: str = "", route: str = "", backend: str = "") -> str:
    return f"""
server: {{{server}}}
backends:
  pool:
    dialect: vllm
    url: {pool.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    signals: {{health_url: {pool.url}/health}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
    {backend}
routes:
  kimi-k3:
    backends: [pool]
    {route}
tuning: {{probes: {{enabled: false}}}}
"""


@contextlib.contextmanager
def served_gateway(tmp_path: Path, policy_text: str, *extra: str) -> Iterator[ServedGateway]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    port = free_port()
    args = python_module(
        "gateway", "serve", "--policy", str(policy), "--port", str(port),
        "--ledger", str(tmp_path / "ledger.sqlite3"), "--grace-s", "5", *extra,
    )  # fmt: skip
    log = tmp_path / "gateway.log"
    process = ProcessServer(args, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, log_path=str(log))
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=60)
        yield ServedGateway(process, url, log)
    finally:
        process.stop(timeout=30)
