"""Reading the upstream's OpenAI SSE events and writing named SSE events, for the translating doors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson


def upstream_objects(events: bytes) -> Iterator[Any]:
    """Each complete event's ``data`` parsed: a dict, or the string "[DONE]"; comments are skipped."""
    for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                yield "[DONE]"
            elif payload:
                obj = _loads(payload)
                if obj is not None:
                    yield obj
            break


def _loads(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None  # not JSON: nothing a translator can say about it


def named_event(name: bytes, obj: Any) -> bytes:
    """``event: <name>`` with its JSON ``data`` (the Anthropic and Responses stream format)."""
    return b"event: " + name + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def chat_usage(obj: Any) -> tuple[int, int, int, int]:
    """(prompt, cached prompt, completion, reasoning) tokens of an OpenAI ``usage`` object, 0 if absent."""
    if not isinstance(obj, dict):
        return 0, 0, 0, 0
    prompt_details = obj.get("prompt_tokens_details")
    completion_details = obj.get("completion_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else 0
    reasoning = completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else 0
    return (
        int(obj.get("prompt_tokens") or 0),
        int(cached or 0),
        int(obj.get("completion_tokens") or 0),
        int(reasoning or 0),
    )


def reasoning_of(delta: dict[str, Any]) -> str | None:
    """The reasoning text of a delta or message, under either field name upstreams use."""
    value = delta.get("reasoning_content") or delta.get("reasoning")
    return value if isinstance(value, str) and value else None
