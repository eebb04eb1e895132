"""Why a llama.cpp backend gets its system messages merged into the leading prompt, shown on the real
llama-server with Gemma 3's chat template: straight to it, a system message after the last user turn is
lost; through the Messages door, Claude Code's request shape (its agent and skill lists as a
mid-conversation system message, adaptive thinking, effort) is answered."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from gateway.backends.chat_shape import shaped
from tests.conftest import Gateway
from tests.real.conftest import ROUTE, LlamaServer
from tests.unit.factories import pool_backend

CLAUDE_CODE_SHAPE: dict[str, Any] = {
    "max_tokens": 8,
    "temperature": 0,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are a terse assistant.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
    ],
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
}


def rendered(server: LlamaServer, messages: list[dict[str, Any]]) -> str:
    """The prompt llama-server's chat template makes of ``messages``."""
    reply = httpx.post(f"{server.url}/apply-template", json={"messages": messages}, timeout=60)
    assert reply.status_code == 200, reply.text
    prompt: str = reply.json()["prompt"]
    return prompt


def test_gemmas_template_loses_a_system_message_after_the_last_user_turn_unless_merged(
    llama_server: LlamaServer,
) -> None:
    """Gemma has no system role: llama.cpp's template prepends system text to the next user turn, so
    one after the last user turn (where Claude Code puts its agent list) vanishes without a word."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
        {"role": "system", "content": "Platform: linux"},
    ]
    assert "Platform: linux" not in rendered(llama_server, messages)
    backend = dataclasses.replace(pool_backend(), dialect="llamacpp")
    merged = shaped({"messages": messages}, backend)[0]["messages"]
    prompt = rendered(llama_server, merged)
    assert "You are terse.\n\nPlatform: linux" in prompt and "Say hi." in prompt


def test_claude_codes_request_shape_is_answered_through_the_messages_door(real_gateway: Gateway) -> None:
    reply = httpx.post(
        real_gateway.url + "/v1/messages", json={**CLAUDE_CODE_SHAPE, "model": ROUTE}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["type"] == "message" and message["content"][-1]["type"] == "text"
    assert message["usage"]["output_tokens"] >= 1
    assert "reasoning_effort dropped" in reply.headers["x-gateway-notes"]
