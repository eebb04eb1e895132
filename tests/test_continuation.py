"""A continued answer arrives as ``content`` on every dialect that can continue (issue 27, defect 5).

A stream cut mid-answer goes on from a second backend of the same dialect; the emulators continue the
way their engines do: SGLang's reasoning parser starts inside the think channel unless the prefix holds
the think-end marker, so it sends the rest of the answer as ``reasoning_content``; vLLM's does unless the
prefill carries its ``reasoning`` (the template then renders the think channel closed); llama-server
resolves a continuation with content to content. The client must read the whole answer as content.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.emulator import create_emulator_app
from tests.conftest import TIME_SCALE, Gateway, Upstreams, running_gateway
from tests.servers import ThreadedServer, threaded_server
from tests.test_resume import HELLO, last_request, numbered, set_faults, settled, sse_events, stream_text

PROFILES = {"vllm": "b300-vllm", "sglang": "h200-sglang", "llamacpp": "a100-llamacpp"}
# Where the thinking so far goes in the prefill: the engines that render it as a closed think channel
# (SGLang takes the prefix's content alone).
THINKING_FIELD = {"vllm": "reasoning", "llamacpp": "reasoning_content"}


@pytest.fixture(scope="module")
def pairs() -> Iterator[dict[str, tuple[ThreadedServer, ThreadedServer]]]:
    """Two emulated pools per dialect: the first is cut mid-answer, the second continues."""
    servers = {
        (dialect, n): threaded_server(create_emulator_app(profile, time_scale=TIME_SCALE, seed=20 + n))
        for dialect, profile in PROFILES.items()
        for n in (1, 2)
    }
    started = {key: context.__enter__() for key, context in servers.items()}
    try:
        yield {dialect: (started[(dialect, 1)], started[(dialect, 2)]) for dialect in PROFILES}
    finally:
        for context in servers.values():
            context.__exit__(None, None, None)


@pytest.fixture
def gateway(
    pairs: dict[str, tuple[ThreadedServer, ThreadedServer]], upstreams: Upstreams, tmp_path: Path
) -> Iterator[Gateway]:
    backends, routes = "", ""
    for dialect, (first, second) in pairs.items():
        for server in (first, second):
            httpx.delete(server.url + "/emulator/faults")
            httpx.delete(server.url + "/emulator/requests")
        for name, server in ((f"{dialect}-a", first), (f"{dialect}-b", second)):
            backends += f"""
  {name}:
    dialect: {dialect}
    url: {server.url}/v1
    model: moonshotai/Kimi-K3
    family: kimi-k3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}  # generous: the machine is shared"""
        routes += f"""
  {dialect}-pair:
    backends: [{dialect}-a, {dialect}-b]
    exploration: 0"""
    path = tmp_path / "policy.yaml"
    path.write_text(f"backends:{backends}\nroutes:{routes}\ntuning: {{probes: {{enabled: false}}}}\n")
    with running_gateway(path) as running:
        yield running


def cut_and_continue(
    gateway: Gateway, pair: tuple[ThreadedServer, ThreadedServer], dialect: str, thinking: int
) -> list[Any]:
    first, second = pair
    # The role chunk, the thinking, then word0..word5, then the connection drops.
    set_faults(first.url, reasoning_tokens=thinking, content_tokens=20, drop_after_chunks=1 + thinking + 6)
    set_faults(second.url, reasoning_tokens=thinking, content_tokens=20)
    body = {"model": f"{dialect}-pair", "messages": HELLO, "stream": True}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.headers["x-gateway-backend"] == f"{dialect}-a"
    return sse_events(response.text)


@pytest.mark.parametrize("thinking", [3, 0])
@pytest.mark.parametrize("dialect", list(PROFILES))
def test_a_continued_answer_arrives_as_content(
    gateway: Gateway, pairs: dict[str, tuple[ThreadedServer, ThreadedServer]], dialect: str, thinking: int
) -> None:
    events = cut_and_continue(gateway, pairs[dialect], dialect, thinking)
    assert events[-1] == "[DONE]"
    assert stream_text(events, "content") == numbered("word", 20), "the whole answer, as content"
    reasoning = stream_text(events, "reasoning") + stream_text(events, "reasoning_content")
    assert reasoning == numbered("think", thinking), "no answer word turned into thinking"
    attempts = settled(gateway).attempts
    assert [(a.backend, a.resumed) for a in attempts] == [
        (f"{dialect}-a", None),
        (f"{dialect}-b", "continued"),
    ]
    assert attempts[1].usage is not None and attempts[1].status == "ok"
    asked = last_request(pairs[dialect][1].url)
    assert asked["messages"][-1] == {
        "role": "assistant",
        "content": numbered("word", 6),
        **(
            {THINKING_FIELD[dialect]: numbered("think", thinking)}
            if dialect in THINKING_FIELD and thinking
            else {}
        ),
    }
    assert asked["continue_final_message"] is True
    # SGLang has no add_generation_prompt field (it would ignore it); vLLM and llama-server refuse
    # continue_final_message without add_generation_prompt false.
    assert asked.get("add_generation_prompt") is (None if dialect == "sglang" else False)


@pytest.mark.parametrize(
    ("dialect", "prefill", "field"),
    [
        ("sglang", {}, "reasoning_content"),
        ("sglang", {"content": "<|close|>think<|sep|>word0 "}, "content"),
        ("vllm", {}, "reasoning"),
        ("vllm", {"reasoning": "think0 "}, "content"),
        ("llamacpp", {}, "content"),
    ],
)
def test_the_emulators_continue_as_their_engines_do(
    pairs: dict[str, tuple[ThreadedServer, ThreadedServer]], dialect: str, prefill: dict[str, str], field: str
) -> None:
    """Straight to the emulator: what a continuation streams back when nobody fixes it up."""
    server = pairs[dialect][1]
    httpx.delete(server.url + "/emulator/faults")
    set_faults(server.url, reasoning_tokens=2, content_tokens=4)
    message = {"role": "assistant", "content": "word0 ", **prefill}
    body = {
        "model": "m",
        "messages": [*HELLO, message],
        "stream": True,
        "continue_final_message": True,
        **({} if dialect == "sglang" else {"add_generation_prompt": False}),
    }
    events = sse_events(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30).text)
    assert stream_text(events, field) == "word1 word2 word3 "
