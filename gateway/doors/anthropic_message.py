"""A chat completion as an Anthropic Message: the whole Message (``message_of``) and the parts a streamed
one shares with it (ids, usage, stop reasons), so the door and its stream translator both sit above it."""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from gateway.doors.sse import chat_usage, reasoning_of

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}  # fmt: skip


def message_of(completion: Any, model: str) -> dict[str, Any]:
    """A whole chat completion as an Anthropic Message named after the client's ``model``."""
    choice = (completion.get("choices") or [{}])[0] if isinstance(completion, dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    thinking = reasoning_of(message)
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = _json_input(function.get("arguments"))
        block = {"type": "tool_use", "id": call.get("id") or tool_use_id(), "name": function.get("name")}
        content.append({**block, "input": arguments})
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": usage_of(completion.get("usage")),
    }


def usage_of(usage: Any) -> dict[str, Any]:
    """Anthropic usage: input_tokens excludes cache reads; output_tokens includes thinking (once)."""
    prompt, cached, completion, reasoning = chat_usage(usage)
    return {
        "input_tokens": prompt - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": completion,
        "output_tokens_details": {"thinking_tokens": reasoning},
    }


def message_id(upstream_id: Any) -> str:
    return (
        f"msg_{upstream_id}"
        if isinstance(upstream_id, str) and upstream_id
        else f"msg_{secrets.token_hex(12)}"
    )


def tool_use_id() -> str:
    return f"toolu_{secrets.token_hex(12)}"


def _json_input(arguments: Any) -> Any:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}
