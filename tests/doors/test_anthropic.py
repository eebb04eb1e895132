"""The Messages door through the official anthropic SDK (sync and async, streaming and not), against the
gateway on the emulators: answers, thinking, tool round trips, usage and ledger rows, errors."""

from __future__ import annotations

import math
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import Gateway
from tests.doors.ledger import ANSWER, THINKING, ledger_row, settled_request_id

HELLO = [{"role": "user", "content": "Hello there, gateway."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


def client(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def check_books(gateway: Gateway, usage: Any, prompt_chars: int, nth: int = 1) -> None:
    """The SDK's usage is the upstream's, and so is the ledger row; thinking is billed once."""
    row = ledger_row(gateway, settled_request_id(gateway, nth))
    prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert prompt == row["prompt_tokens"] == math.ceil(prompt_chars / 4)  # the emulator's count
    assert usage.output_tokens == row["completion_tokens"] == 96  # 64 thinking + 32 answer tokens
    assert usage.output_tokens_details.thinking_tokens == row["reasoning_tokens"] == 64
    assert (row["endpoint"], row["backend"], row["status"]) == ("messages", "b300-vllm", "ok")
    assert row["usage_source"] == "reported" and row["cost_usd"] > 0


def test_a_whole_message_has_thinking_text_and_usage(gateway: Gateway) -> None:
    message = client(gateway).messages.create(
        model="vllm-only", max_tokens=1000, system="Be brief.", messages=HELLO
    )
    assert message.role == "assistant" and message.model == "vllm-only"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THINKING  # type: ignore[union-attr]
    assert message.content[1].text == ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    check_books(gateway, message.usage, len("Be brief.") + len(HELLO[0]["content"]))


def test_a_stream_has_the_event_sequence_the_sdk_expects(gateway: Gateway) -> None:
    with client(gateway).messages.stream(model="vllm-only", max_tokens=1000, messages=HELLO) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 2
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THINKING  # type: ignore[union-attr]
    assert message.content[1].text == ANSWER  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn"
    check_books(gateway, message.usage, len(HELLO[0]["content"]))


def test_the_raw_stream_names_every_event_as_the_api_does(gateway: Gateway) -> None:
    body = {"model": "vllm-only", "max_tokens": 1000, "messages": HELLO, "stream": True}
    raw = httpx.post(gateway.url + "/v1/messages", json=body, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    names = [line[7:] for line in raw.text.splitlines() if line.startswith("event: ")]
    blocks = [
        "content_block_start",
        *["content_block_delta"] * 64,
        "content_block_delta",
        "content_block_stop",
    ]
    blocks += ["content_block_start", *["content_block_delta"] * 32, "content_block_stop"]
    assert names == ["message_start", "ping", *blocks, "message_delta", "message_stop"]
    assert "data: [DONE]" not in raw.text


def test_max_tokens_stops_with_max_tokens(gateway: Gateway) -> None:
    message = client(gateway).messages.create(model="vllm-only", max_tokens=70, messages=HELLO)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 70


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_and_its_result_make_a_round_trip(gateway: Gateway, stream: bool) -> None:
    sdk = client(gateway)
    ask = {"model": "vllm-only", "max_tokens": 1000, "tools": [WEATHER], "messages": HELLO}
    if stream:
        with sdk.messages.stream(**ask) as events:  # type: ignore[arg-type]
            deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
            first = events.get_final_message()
        assert "input_json_delta" in deltas
    else:
        first = sdk.messages.create(**ask)  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"query": ANSWER}
    check_books(gateway, first.usage, len(HELLO[0]["content"]))
    history = [
        *HELLO,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}]},
    ]
    second = sdk.messages.create(model="vllm-only", max_tokens=1000, tools=[WEATHER], messages=history)  # type: ignore[arg-type]
    assert second.stop_reason == "end_turn"
    assert second.content[-1].text == ANSWER  # type: ignore[union-attr]
    log = gateway.runtime.policy.backends["b300-vllm"].base_url[:-3] + "/emulator/requests"
    sent = httpx.get(log, params={"path": "/v1/chat/completions"})  # not the metrics scrapes
    upstream_messages = sent.json()[-1]["body"]["messages"]
    assert upstream_messages[1]["tool_calls"][0]["id"] == call.id
    assert upstream_messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "Sunny"}


async def test_the_async_client_streams_and_completes(gateway: Gateway) -> None:
    sdk = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    try:
        message = await sdk.messages.create(model="vllm-only", max_tokens=1000, messages=HELLO)
        assert message.content[1].text == ANSWER  # type: ignore[union-attr]
        async with sdk.messages.stream(model="vllm-only", max_tokens=1000, messages=HELLO) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        assert text == ANSWER
        assert final.content[0].thinking == THINKING  # type: ignore[union-attr]
        assert final.usage.output_tokens == 96
    finally:
        await sdk.close()


def test_errors_come_in_anthropic_shape(gateway: Gateway) -> None:
    sdk = client(gateway)
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(model="no-such-route", max_tokens=10, messages=HELLO)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model="vllm-only", max_tokens=0, messages=HELLO)
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    raw = httpx.post(gateway.url + "/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert raw.status_code == 400
    assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == "invalid_request_error"
