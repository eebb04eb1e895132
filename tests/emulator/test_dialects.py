"""Each dialect's wire shapes over real HTTP: stream frames, usage rules, reasoning fields, errors."""

from __future__ import annotations

import math
from typing import Any

import httpx
import openai
import pytest

from gateway.emulator import PROFILES
from tests.emulator.conftest import StartEmulator
from tests.emulator.sse import PROMPT, chat_body, deltas, sse_frames, words

FAST = 0.001
PROMPT_TOKENS = math.ceil(len(PROMPT) / 4)


async def test_vllm_streams_role_then_reasoning_then_content_and_no_usage_unless_asked(
    emulator: StartEmulator,
) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        frames = await sse_frames(client, "/v1/chat/completions", chat_body())
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    token_deltas = deltas(chunks[1:])
    assert len(token_deltas) == 96  # one frame per token
    assert [d["reasoning"] for d in token_deltas[:64]] == words("think", 64)
    assert [d["content"] for d in token_deltas[64:]] == words("word", 32)
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None] * 95 + ["stop"]
    assert all("usage" not in c for c in chunks)


async def test_vllm_usage_chunk_with_include_usage(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        frames = await sse_frames(client, "/v1/chat/completions", chat_body(include_usage=True))
    usage_chunk = frames[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": 96,  # reasoning included
        "total_tokens": PROMPT_TOKENS + 96,
        "completion_tokens_details": {"reasoning_tokens": 64},
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert all("usage" not in c for c in frames[:-2])


@pytest.mark.parametrize("how", ["knob", "client"])
async def test_vllm_continuous_usage_is_cumulative_on_every_frame(emulator: StartEmulator, how: str) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        if how == "knob":
            await client.post("/emulator/faults", json={"continuous_usage": True})
            body = chat_body()
        else:
            body = chat_body(stream_options={"include_usage": True, "continuous_usage_stats": True})
        frames = await sse_frames(client, "/v1/chat/completions", body)
    chunks = frames[:-1]
    assert all("usage" in c for c in chunks)
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == [*range(97), 96]  # role chunk, 96 tokens, then the final usage chunk
    reasoning = [c["usage"]["completion_tokens_details"]["reasoning_tokens"] for c in chunks]
    assert reasoning[64] == 64 and reasoning[-1] == 64


async def test_vllm_reasoning_field_knob_and_full_response(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        full = (await client.post("/v1/chat/completions", json=chat_body(stream=False))).json()
        await client.post("/emulator/faults", json={"reasoning_field": "reasoning_content"})
        frames = await sse_frames(client, "/v1/chat/completions", chat_body())
        older = (await client.post("/v1/chat/completions", json=chat_body(stream=False))).json()
    message = full["choices"][0]["message"]
    assert message["reasoning"] == "".join(words("think", 64))
    assert message["content"] == "".join(words("word", 32))
    assert full["usage"]["completion_tokens"] == 96
    assert full["usage"]["completion_tokens_details"] == {"reasoning_tokens": 64}
    assert "reasoning" not in deltas(frames)[1] and deltas(frames)[1]["reasoning_content"] == "think0 "
    assert older["choices"][0]["message"]["reasoning_content"] == "".join(words("think", 64))


async def test_max_tokens_cuts_the_output_with_finish_reason_length(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = chat_body(stream=False, max_completion_tokens=70)
        response = (await client.post("/v1/chat/completions", json=body)).json()
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["choices"][0]["message"]["content"] == "".join(words("word", 6))
    assert response["usage"]["completion_tokens"] == 70


async def test_vllm_prefix_cache_reports_cached_tokens_for_a_repeated_prompt(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    long_prompt = "The same long system prompt, sent again and again. " * 40
    body = {"messages": [{"role": "user", "content": long_prompt}]}
    async with httpx.AsyncClient(base_url=server.url) as client:
        first = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
        second = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"] and cached % 16 == 0


async def test_llamacpp_stream_has_timings_on_the_last_chunk_and_no_reasoning_count(
    emulator: StartEmulator,
) -> None:
    server = emulator("a100-llamacpp", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        with_usage = await sse_frames(client, "/v1/chat/completions", chat_body(include_usage=True))
        without = await sse_frames(client, "/v1/chat/completions", chat_body())
    chunks = with_usage[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    token_deltas = deltas(chunks[1:-2])
    assert [d["reasoning_content"] for d in token_deltas[:48]] == words("think", 48)
    assert [d["content"] for d in token_deltas[48:]] == words("word", 32)
    finish, usage_chunk = chunks[-2], chunks[-1]
    assert finish["choices"] == [{"finish_reason": "stop", "index": 0, "delta": {}}]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"completion_tokens": 80, "prompt_tokens": PROMPT_TOKENS,
                                    "total_tokens": PROMPT_TOKENS + 80,
                                    "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    timings = usage_chunk["timings"]
    assert timings["predicted_n"] == 80 and timings["predicted_per_second"] > 0
    assert {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms",
            "predicted_per_token_ms"} <= timings.keys()  # fmt: skip
    assert all("timings" not in c for c in chunks[:-1])
    # Without include_usage: no usage at all, and the timings ride on the finish chunk.
    assert all("usage" not in c for c in without[:-1])
    assert without[-2]["choices"][0]["finish_reason"] == "stop" and "timings" in without[-2]


async def test_llamacpp_full_response_and_omit_stream_usage(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        full = (await client.post("/v1/chat/completions", json=chat_body(stream=False))).json()
        await client.post("/emulator/faults", json={"omit_stream_usage": True})
        frames = await sse_frames(client, "/v1/chat/completions", chat_body(include_usage=True))
    assert full["choices"][0]["message"]["reasoning_content"] == "".join(words("think", 48))
    # No reasoning count (llama.cpp never counts thinking apart), only the cached prompt share.
    assert set(full["usage"]) == {
        "completion_tokens",
        "prompt_tokens",
        "total_tokens",
        "prompt_tokens_details",
    }
    assert full["usage"]["completion_tokens"] == 80
    assert full["timings"]["predicted_n"] == 80
    assert all("usage" not in f for f in frames[:-1])
    assert "timings" in frames[-2]


async def test_paid_api_stream_reports_reasoning_inside_completion_tokens(emulator: StartEmulator) -> None:
    server = emulator("paid-api", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        frames = await sse_frames(client, "/v1/chat/completions", chat_body(include_usage=True))
    chunks = frames[:-1]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert [d["reasoning_content"] for d in deltas(chunks)[1:65]] == words("think", 64)
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 96
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 64}
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_completions_endpoint_streams_plain_text(emulator: StartEmulator, profile: str) -> None:
    server = emulator(profile, time_scale=FAST)
    body = {"prompt": PROMPT, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=server.url) as client:
        frames = await sse_frames(client, "/v1/completions", body)
        full = (await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10})).json()
    texts = "".join(f["choices"][0]["text"] for f in frames[:-1] if f["choices"])
    assert texts == "".join(words("think", 10))
    assert frames[-1] == "[DONE]"
    assert [f["usage"]["completion_tokens"] for f in frames[:-1] if f.get("usage")] == [10]
    assert full["object"] == "text_completion" and full["choices"][0]["finish_reason"] == "length"
    assert full["usage"]["completion_tokens"] == 10


ERROR_SHAPES: dict[str, Any] = {
    "b300-vllm": lambda e: e["code"] == 400 and e["type"] == "BadRequestError" and "param" in e,
    "a100-llamacpp": lambda e: e["code"] == 400 and e["type"] == "invalid_request_error",
    "paid-api": lambda e: e["type"] == "invalid_request_error" and "param" in e and "code" in e,
    "anthropic-api": lambda e: e["type"] == "invalid_request_error" and set(e) == {"type", "message"},
    # SGLang's errors are flat: {"object": "error", "message", "type", "param", "code"}.
    "h200-sglang": lambda e: e["object"] == "error" and e["type"] == "Bad Request" and e["code"] == 400,
}


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_bad_requests_answer_400_in_the_dialect_error_shape(
    emulator: StartEmulator, profile: str
) -> None:
    server = emulator(profile, time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        broken = await client.post("/v1/chat/completions", content=b"{not json")
        no_messages = await client.post("/v1/chat/completions", json={"model": "kimi"})
        no_prompt = await client.post("/v1/completions", json={"model": "kimi"})
    for response in (broken, no_messages, no_prompt):
        assert response.status_code == 400
        error = response.json().get("error", response.json())
        assert ERROR_SHAPES[profile](error), response.json()
        assert error["message"]


async def test_vllm_rejects_stream_options_without_stream(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=False, include_usage=True))
    assert response.status_code == 400


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_models_lists_the_profile_model(emulator: StartEmulator, profile: str) -> None:
    server = emulator(profile, time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        listed = (await client.get("/v1/models")).json()
    assert listed["data"][0]["id"] == PROFILES[profile].model


async def test_openai_sdk_reads_a_vllm_stream(emulator: StartEmulator) -> None:
    server = emulator("b300-vllm", time_scale=FAST)
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="moonshotai/Kimi-K3",
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning", None) or "")
            content.append(choice.delta.content or "")
    await client.close()
    assert "".join(reasoning) == "".join(words("think", 64))
    assert "".join(content) == "".join(words("word", 32))
    assert usage is not None and usage.completion_tokens == 96
