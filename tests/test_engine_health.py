"""The gateway against the engines' real health behaviour (docs/contracts, section health; issue 27):
SGLang's /health takes over a second, vLLM refuses connections while it loads and answers 503 only
when its engine is dead."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.emulator import GatedServer, create_emulator_app
from tests.conftest import Gateway, running_gateway
from tests.servers import ThreadedServer, threaded_server

FAST = 0.001


def policy(name: str, dialect: str, url: str, signals: str = "") -> str:
    return f"""
backends:
  {name}:
    dialect: {dialect}
    url: {url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 60, accounting: marginal}}}}
    signals: {{metrics_url: {url}/metrics, health_url: {url}/health{signals}}}
routes:
  kimi-k3:
    backends: [{name}]
"""


def backend_state(gateway: Gateway, name: str) -> Any:
    report = httpx.get(gateway.url + "/ready", timeout=10).json()
    return report["backends"][name]


def wait_for(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.05)


def test_an_sglang_backend_whose_health_generates_for_a_second_is_routed_to_with_the_defaults(
    tmp_path: Path,
) -> None:
    """Before: the health GET gave up after min(max(interval_s, 0.5), 2) = 1 s, never saw a 200, and the
    only backend of the route was never used."""
    with threaded_server(create_emulator_app("h200-sglang", time_scale=FAST, environ={})) as sglang:
        path = tmp_path / "policy.yaml"
        path.write_text(policy("sglang", "sglang", sglang.url))
        with running_gateway(path) as gateway:
            wait_for(lambda: backend_state(gateway, "sglang") == "ok", 30, "the SGLang backend healthy")
            body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}]}
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-gateway-backend"] == "sglang"
        state = httpx.get(sglang.url + "/emulator/state", timeout=10).json()
    assert state["health_generations"] >= 1  # it did answer the way SGLang does, after a generation


def test_a_loading_vllm_is_booting_and_a_dead_one_is_down(tmp_path: Path) -> None:
    """Before: a refused connection read as down and vLLM's 503 (a dead engine) as booting."""
    profile_boot_s = 27 * 60
    app = create_emulator_app("b300-vllm", time_scale=1.5 / profile_boot_s, cold_boot=True)
    server = ThreadedServer(app, server_cls=GatedServer).start()
    try:
        path = tmp_path / "policy.yaml"
        path.write_text(policy("vllm", "vllm", server.url, ", interval_s: 0.1"))
        with running_gateway(path) as gateway:
            wait_for(lambda: backend_state(gateway, "vllm") == "booting", 10, "the loading vLLM booting")
            wait_for(lambda: backend_state(gateway, "vllm") == "ok", 30, "the loaded vLLM healthy")
            httpx.post(
                server.url + "/emulator/faults", json={"engine_dead": True}, timeout=10
            ).raise_for_status()
            wait_for(lambda: backend_state(gateway, "vllm") == "down", 10, "the dead vLLM down")
    finally:
        server.stop()
