"""Fault knobs, the request log and the paid API's key check, each over real HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway.emulator import PROFILES
from tests.emulator.conftest import StartEmulator
from tests.emulator.sse import chat_body, sse_frames

FAST = 0.001


async def test_faults_merge_validate_and_reset(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        defaults = (await client.get("/emulator/faults")).json()
        merged = (await client.post("/emulator/faults", json={"error_rate": 0.5})).json()
        merged = (await client.post("/emulator/faults", json={"slowdown": 2})).json()
        unknown = await client.post("/emulator/faults", json={"no_such_knob": 1})
        out_of_range = await client.post("/emulator/faults", json={"error_rate": 2})
        reset = (await client.delete("/emulator/faults")).json()
    assert defaults["error_rate"] == 0 and defaults["reasoning_field"] == "reasoning"
    assert merged["error_rate"] == 0.5 and merged["slowdown"] == 2
    assert unknown.status_code == 400 and "no_such_knob" in unknown.json()["error"]
    assert out_of_range.status_code == 400
    assert reset == defaults


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_error_rate_one_answers_the_error_status(emulator: StartEmulator, profile: str) -> None:
    server = emulator(profile, time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/emulator/faults", json={"error_rate": 1})
        default_status = await client.post("/v1/chat/completions", json=chat_body())
        await client.post("/emulator/faults", json={"error_status": 503})
        chosen_status = await client.post("/v1/chat/completions", json=chat_body(stream=False))
    assert default_status.status_code == 500
    assert default_status.json().get("error", default_status.json())["message"]  # SGLang's are flat
    assert chosen_status.status_code == 503


async def test_hang_sends_nothing_until_the_client_gives_up(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/emulator/faults", json={"hang": True})
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/chat/completions", json=chat_body(), timeout=0.2)
        await client.delete("/emulator/faults")
        after = await client.post("/v1/chat/completions", json=chat_body(stream=False))
        state = (await client.get("/emulator/state")).json()
    assert after.status_code == 200
    assert state["running"] == 0


async def test_drop_after_chunks_cuts_a_stream_before_done(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    frames: list[str] = []
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/emulator/faults", json={"drop_after_chunks": 3})
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("POST", "/v1/chat/completions", json=chat_body()) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        frames.append(line)
    assert len(frames) == 3
    assert "[DONE]" not in "".join(frames)


async def test_drop_closes_a_non_streaming_request_without_a_response(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/emulator/faults", json={"drop_after_chunks": 0})
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=chat_body(stream=False))
        assert (await client.get("/health")).status_code == 200  # the server itself is fine


async def test_rate_limit_answers_429_with_retry_after(emulator: StartEmulator) -> None:
    server = emulator("paid-api", time_scale=0.01)  # a minute of emulated time is 0.6 s
    body = chat_body(stream=False)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post(
            "/emulator/faults", json={"rate_limit_rpm": 2, "content_tokens": 1, "reasoning_tokens": 0}
        )
        first, second, third = [await client.post("/v1/chat/completions", json=body) for _ in range(3)]
        assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
        assert int(third.headers["retry-after"]) >= 1
        wait_ms = int(third.headers["retry-after-ms"])
        assert 0 < wait_ms <= 600
        error = third.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
        await asyncio.sleep(wait_ms / 1000 + 0.05)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


async def _time_to_first_token(client: httpx.AsyncClient) -> float:
    started = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=chat_body()) as response:
        async for line in response.aiter_lines():
            if '"reasoning"' in line:
                return time.monotonic() - started
    raise AssertionError("no token arrived")


async def test_added_ttft_delays_the_first_token(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=0.01)
    async with httpx.AsyncClient(base_url=server.url) as client:
        plain = await _time_to_first_token(client)
        await client.post("/emulator/faults", json={"added_ttft_ms": 20_000})  # 20 emulated s -> 0.2 s
        delayed = await _time_to_first_token(client)
    assert delayed >= 0.2  # a sleep is never shorter than asked
    assert delayed > plain


async def test_slowdown_divides_the_decode_speed(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        before = (await client.get("/emulator/state")).json()["per_stream_tokens_per_s"]
        await client.post("/emulator/faults", json={"slowdown": 3})
        after = (await client.get("/emulator/state")).json()["per_stream_tokens_per_s"]
    assert before == 9.0 and after == 3.0


async def test_output_length_knobs(emulator: StartEmulator) -> None:
    server = emulator("paid-api", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.post("/emulator/faults", json={"reasoning_tokens": 5, "content_tokens": 2})
        response = (await client.post("/v1/chat/completions", json=chat_body(stream=False))).json()
    assert response["choices"][0]["message"]["content"] == "word0 word1 "
    assert response["usage"]["completion_tokens"] == 7
    assert response["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


async def test_request_log_keeps_headers_and_bodies(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        await client.get("/health")
        body = chat_body(include_usage=True)
        await sse_frames(client, "/v1/chat/completions", {**body, "model": "moonshotai/Kimi-K3"})
        await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer upstream-key"})
        logged = (await client.get("/emulator/requests", params={"path": "/v1/chat/completions"})).json()
        everything = (await client.get("/emulator/requests")).json()
        cleared = (await client.delete("/emulator/requests")).json()
        after = (await client.get("/emulator/requests")).json()
    assert len(logged) == 2 and len(everything) == 3
    assert logged[0]["method"] == "POST"
    assert logged[0]["body"]["stream_options"] == {"include_usage": True}
    assert logged[1]["headers"]["authorization"] == "Bearer upstream-key"
    assert cleared == {"cleared": 3} and after == []


async def test_paid_api_checks_the_key_when_one_is_set(
    emulator: StartEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMULATOR_API_KEY", "sk-right")
    server = emulator("paid-api", time_scale=FAST)
    body = chat_body(stream=False)
    async with httpx.AsyncClient(base_url=server.url) as client:
        missing = await client.post("/v1/chat/completions", json=body)
        wrong = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-wrong"}
        )
        right = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-right"}
        )
        health = await client.get("/health")
    assert missing.status_code == wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200
    assert health.status_code == 200
