"""The ``error_after_chunks`` fault ends a stream as each engine does when its generation fails mid-way
(gateway/emulator/stream_errors.py cites the engines' sources): vLLM's error event then [DONE], SGLang's
error event, its usage chunk then [DONE], llama-server's error event and nothing after it."""

from __future__ import annotations

import httpx
import pytest

from tests.emulator.conftest import StartEmulator
from tests.emulator.sse import chat_body, sse_frames

FAST = 0.001


@pytest.mark.parametrize(
    ("profile", "after_error", "code", "kind"),
    [
        ("b300-vllm", ["[DONE]"], 500, "InternalServerError"),
        ("h200-sglang", ["usage", "[DONE]"], 500, "INTERNAL_SERVER_ERROR"),
        ("a100-llamacpp", [], 500, "server_error"),
    ],
)
async def test_error_after_chunks_ends_the_stream_as_the_engine_does(
    emulator: StartEmulator, profile: str, after_error: list[str], code: int, kind: str
) -> None:
    server = emulator(profile, time_scale=FAST)
    async with httpx.AsyncClient(base_url=server.url) as client:
        faults = {"error_after_chunks": 3, "reasoning_tokens": 0, "content_tokens": 10}
        (await client.post("/emulator/faults", json=faults)).raise_for_status()
        frames = await sse_frames(client, "/v1/chat/completions", chat_body(include_usage=True))
    errors = [i for i, f in enumerate(frames) if isinstance(f, dict) and "error" in f]
    assert errors == [3], frames
    error = frames[3]["error"]
    assert (error["code"], error["type"]) == (code, kind) and error["message"]
    rest = ["[DONE]" if f == "[DONE]" else "usage" if f.get("usage") else "other" for f in frames[4:]]
    assert rest == after_error
    if "usage" in rest:  # what was generated before the failure, not the whole planned answer
        assert 0 < frames[4]["usage"]["completion_tokens"] < 10
