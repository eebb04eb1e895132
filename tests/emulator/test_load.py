"""Load behaviour: Prometheus signals, continuous batching, llama.cpp slots and queueing, cold boot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.emulator.conftest import StartEmulator
from tests.emulator.sse import chat_body
from tests.servers import wait_http

VLLM_SIGNALS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)
LLAMACPP_SIGNALS = (
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:predicted_tokens_seconds",
    "llamacpp:prompt_tokens_seconds",
    "llamacpp:tokens_predicted_total",
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
)


def samples(text: str) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(10):
        while True:  # polling a server in another thread: nothing here to wait on but its answers
            if await check():
                return
            await asyncio.sleep(0.005)


async def test_vllm_metrics_carry_load_signals_with_model_name(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=0.001)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/v1/chat/completions", json=chat_body(stream=False))
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    for name in VLLM_SIGNALS:
        assert name in found, name
        assert all(s.labels["model_name"] == "moonshotai/Kimi-K3" for s in found[name])
    assert found["vllm:generation_tokens_total"][0].value == 96
    assert found["vllm:time_to_first_token_seconds_count"][0].value == 1
    assert 0.0 <= found["vllm:kv_cache_usage_perc"][0].value <= 1.0


async def test_llamacpp_metrics_names(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=0.001)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/v1/chat/completions", json=chat_body(stream=False))
        found = samples((await client.get("/metrics")).text)
    for name in LLAMACPP_SIGNALS:
        assert name in found, name
    assert found["llamacpp:tokens_predicted_total"][0].value == 80
    assert found["llamacpp:predicted_tokens_seconds"][0].value > 0


async def _decode_rate(client: httpx.AsyncClient) -> float:
    """Tokens per second between a stream's first and last token, as the client sees them."""
    arrivals: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=chat_body()) as response:
        async for line in response.aiter_lines():
            if '"delta":{"content"' in line or '"delta":{"reasoning"' in line:
                arrivals.append(time.monotonic())
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


async def test_continuous_batching_slows_each_stream(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=0.1)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await client.post("/emulator/faults", json={"reasoning_tokens": 0, "content_tokens": 60})
        alone = await _decode_rate(client)
        assert (await client.get("/emulator/state")).json()["per_stream_tokens_per_s"] == 92.0

        crowd = [asyncio.create_task(_decode_rate(client)) for _ in range(16)]

        async def all_running() -> bool:
            state = (await client.get("/emulator/state")).json()
            return bool(state["running"] == 16)

        await eventually(all_running)
        state = (await client.get("/emulator/state")).json()
        rates = await asyncio.gather(*crowd)
    # Per-stream speed = 92 * n ** -0.25: half the single-stream speed at 16 streams, double the aggregate.
    assert abs(state["per_stream_tokens_per_s"] - 92 * 16**-0.25) < 1e-6
    assert abs(state["aggregate_tokens_per_s"] - 92 * 16**0.75) < 1e-6
    mean_crowded = sum(rates) / len(rates)
    assert mean_crowded < alone / 1.3  # expected 2x slower; generous margin for a busy machine


async def test_llamacpp_fifth_request_waits_for_a_slot(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=0.005)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await client.post("/emulator/faults", json={"reasoning_tokens": 4, "content_tokens": 4})
        body = chat_body(stream=False)
        requests = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(5)]

        async def one_deferred() -> bool:
            found = samples((await client.get("/metrics")).text)
            return bool(found["llamacpp:requests_deferred"][0].value == 1)

        await eventually(one_deferred)
        found = samples((await client.get("/metrics")).text)
        slots = (await client.get("/slots")).json()
        responses = await asyncio.gather(*requests)
        after = (await client.get("/slots")).json()
    assert found["llamacpp:requests_processing"][0].value == 4
    assert len(slots) == 4 and all(slot["is_processing"] for slot in slots)
    assert {"id", "n_ctx", "is_processing", "id_task", "next_token"} <= slots[0].keys()
    assert all(r.status_code == 200 for r in responses)
    assert not any(slot["is_processing"] for slot in after)


async def test_a_client_that_leaves_gives_its_slot_back(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=0.05)  # TTFT 7 s -> 350 ms, longer than the client waits
    async with httpx.AsyncClient(base_url=server.url, timeout=0.1) as impatient:
        results = await asyncio.gather(
            *(impatient.post("/v1/chat/completions", json=chat_body()) for _ in range(6)),
            return_exceptions=True,
        )
    assert all(isinstance(r, httpx.TimeoutException) for r in results)
    async with httpx.AsyncClient(base_url=server.url) as client:

        async def idle() -> bool:
            state = (await client.get("/emulator/state")).json()
            return bool(state["running"] == 0 and state["waiting"] == 0)

        await eventually(idle)


async def test_vllm_cold_boot_refuses_connections_then_answers(emulator: StartEmulator) -> None:
    """vLLM does not listen while it loads (docs/contracts/vllm.yaml, health.refused_while_loading)."""
    server = emulator("b300-vllm", time_scale=0.0002, cold_boot=True)  # 27 min -> 0.32 s
    async with httpx.AsyncClient(base_url=server.url) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/health")
        with pytest.raises(httpx.ConnectError):
            await client.post("/v1/chat/completions", json=chat_body(stream=False))
    await asyncio.to_thread(wait_http, f"{server.url}/health", 10.0)
    async with httpx.AsyncClient(base_url=server.url) as client:
        health = await client.get("/health")
        completion = await client.post("/v1/chat/completions", json=chat_body(stream=False))
        assert (await client.get("/emulator/state")).json()["booting"] is False
    assert health.status_code == 200 and health.content == b""
    assert completion.status_code == 200


async def test_llamacpp_cold_boot_says_loading_model(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=0.005, cold_boot=True)  # 60 s -> 0.3 s
    async with httpx.AsyncClient(base_url=server.url) as client:
        loading = await client.get("/health")
    assert loading.status_code == 503
    assert loading.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    await asyncio.to_thread(wait_http, f"{server.url}/health", 10.0)
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
