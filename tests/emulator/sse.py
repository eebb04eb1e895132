"""Small helpers the emulator tests share: request bodies and reading an SSE stream frame by frame."""

from __future__ import annotations

import json
from typing import Any

import httpx

PROMPT = "Explain why cheaper GPU hours do not always give cheaper tokens."


def chat_body(*, stream: bool = True, include_usage: bool | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "kimi",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
    }
    if include_usage is not None:
        body["stream_options"] = {"include_usage": include_usage}
    return {**body, **extra}


async def sse_frames(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    """Every ``data:`` payload of a stream, JSON-decoded except the final ``[DONE]``."""
    frames: list[Any] = []
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def deltas(frames: list[Any]) -> list[dict[str, Any]]:
    """The delta of every chunk that has a choice."""
    return [f["choices"][0]["delta"] for f in frames if isinstance(f, dict) and f["choices"]]


def words(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i} " for i in range(count)]
