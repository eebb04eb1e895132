"""Streams that survive their backend: a stream cut after its first byte goes on from another backend of
the same model, and the client reads one well-formed stream (the emulators' answers are numbered words,
so "each token exactly once" is checkable: word0, word1, ... with no gap and no repeat)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.emulator import create_emulator_app
from tests.conftest import PAID_KEY, TIME_SCALE, Gateway, Upstreams, running_gateway
from tests.servers import ProcessServer, ThreadedServer, free_port, python_module, threaded_server, wait_http
from tests.spend.conftest import ledger_rows

HELLO = [{"role": "user", "content": "Say hello"}]


def pool(name: str, url: str, *, resume: str | None = None, usd_per_hour: float = 62.93) -> str:
    extra = f"\n    resume: {resume}" if resume else ""
    return f"""
  {name}:
    dialect: vllm
    url: {url}/v1
    model: moonshotai/Kimi-K3
    family: kimi-k3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: {usd_per_hour}, accounting: marginal}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}{extra}"""


def policy(pool_a: str, pool_b: str, paid: str) -> str:
    return f"""
backends:{pool("pool-a", pool_a)}{pool("pool-b", pool_b, usd_per_hour=62.94)}
  api:
    dialect: openai
    url: {paid}/v1
    model: kimi-k3
    family: kimi-k3
    resume: partial
    api_key_env: TEST_PAID_API_KEY
    thinking: mandatory
    pricing: {{per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
  api-plain:
    dialect: openai
    url: {paid}/v1
    model: kimi-k3
    family: kimi-k3
    api_key_env: TEST_PAID_API_KEY
    thinking: mandatory
    pricing: {{per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}}}
routes:
  two-pools:
    backends: [pool-a, pool-b]
    exploration: 0
  pool-then-api:
    backends: [pool-a, api]
    exploration: 0
  cannot-resume:
    backends: [pool-a, api-plain]
    exploration: 0
# These tests choose where a stream starts by route order: a start-up probe could tell the two equal
# pools apart by a few milliseconds of TTFT, and its request would share the emulators' fault knobs.
# pool-b is priced a cent apart so that it is a second pool, not a replica of pool-a (same family at the
# same price: the decision would spread streams over the two by load, policy/affinity.py).
tuning: {{probes: {{on_start: false}}}}
"""


@pytest.fixture(scope="module")
def second_pool() -> Iterator[ThreadedServer]:
    with threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=7)) as server:
        yield server


@pytest.fixture
def resuming(
    upstreams: Upstreams, second_pool: ThreadedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Gateway]:
    upstreams.reset()
    httpx.delete(second_pool.url + "/emulator/faults")
    httpx.delete(second_pool.url + "/emulator/requests")
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstreams.vllm.url, second_pool.url, upstreams.paid.url))
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def set_faults(url: str, **faults: Any) -> None:
    httpx.post(url + "/emulator/faults", json=faults).raise_for_status()


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            events.append(data if data == "[DONE]" else orjson.loads(data))
    return events


def stream_text(events: list[Any], field: str) -> str:
    return "".join(
        (choice.get("delta") or {}).get(field) or ""
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices") or []
    )


def numbered(prefix: str, count: int) -> str:
    return "".join(f"{prefix}{i} " for i in range(count))


def settled(gateway: Gateway) -> Any:
    """The last request once settled: a stream settles just after the client has read its end."""
    deadline = time.monotonic() + 10
    while not gateway.runtime.recent:
        assert time.monotonic() < deadline, "no request settled"
        time.sleep(0.01)
    return gateway.runtime.recent[-1]


def last_request(url: str) -> dict[str, Any]:
    requests = [r for r in httpx.get(url + "/emulator/requests").json() if r["path"].endswith("completions")]
    return requests[-1]["body"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("route", "continues_on"), [("two-pools", "pool-b"), ("pool-then-api", "api")])
def test_a_stream_cut_mid_answer_continues_on_another_backend(
    resuming: Gateway, upstreams: Upstreams, second_pool: ThreadedServer, route: str, continues_on: str
) -> None:
    # pool-a sends its role chunk, 3 thinking tokens and word0..word5, then the connection drops.
    set_faults(upstreams.vllm.url, reasoning_tokens=3, content_tokens=20, drop_after_chunks=10)
    other = second_pool.url if continues_on == "pool-b" else upstreams.paid.url
    set_faults(other, reasoning_tokens=3, content_tokens=20)
    body = {
        "model": route,
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(resuming.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.headers["x-gateway-backend"] == "pool-a"
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
    chunks = [e for e in events if isinstance(e, dict)]
    assert len({c["id"] for c in chunks}) == 1, "one stream id throughout"
    assert sum(1 for c in chunks for ch in c["choices"] if "role" in (ch.get("delta") or {})) == 1
    assert all(ch["index"] == 0 for c in chunks for ch in c["choices"])
    assert stream_text(events, "reasoning") == numbered("think", 3)
    assert stream_text(events, "content") == numbered("word", 20), "each word exactly once, in order"
    # The second backend was asked to continue the answer the client already had.
    continued = last_request(other)
    prefill = continued["messages"][-1]
    assert prefill["role"] == "assistant" and prefill["content"] == numbered("word", 6)
    if continues_on == "pool-b":
        assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
    else:
        assert prefill["partial"] is True
    # One usage, at the end: what both backends generated.
    (usage_chunk,) = [c for c in chunks if c.get("usage")]
    assert usage_chunk is chunks[-1] and usage_chunk["x_gateway_resumed"][0]["to"] == continues_on
    observation = settled(resuming)
    first, second = observation.attempts
    assert (first.backend, first.status, second.backend, second.status) == (
        "pool-a",
        "dropped",
        continues_on,
        "ok",
    )
    assert second.resumed == "continued"
    assert first.usage is not None and second.usage is not None
    assert first.usage.completion_tokens == 9  # 3 thinking + 6 words, counted: the cut stream sent no usage
    assert (
        usage_chunk["usage"]["completion_tokens"]
        == first.usage.completion_tokens + second.usage.completion_tokens
    )
    assert observation.status == "ok" and observation.cost_usd is not None
    # The ledger row keeps each attempt with its own tokens and cost.
    ledger = resuming.policy_path.parent / "ledger.sqlite3"
    deadline = time.monotonic() + 10
    while not (ledger.exists() and ledger_rows(ledger)):
        assert time.monotonic() < deadline, "no ledger row"
        time.sleep(0.05)
    (row,) = ledger_rows(ledger)
    logged = orjson.loads(row["attempt_log"])
    assert [(a["backend"], a["status"], a["resumed"]) for a in logged] == [
        ("pool-a", "dropped", None),
        (continues_on, "ok", "continued"),
    ]
    assert [a["completion_tokens"] for a in logged] == [
        first.usage.completion_tokens,
        second.usage.completion_tokens,
    ]
    assert sum(a["cost_usd"] for a in logged) == pytest.approx(row["cost_usd"])
    metrics = httpx.get(resuming.url + "/metrics").text
    assert f'gateway_streams_resumed_total{{mode="continued",route="{route}"}} 1.0' in metrics


def test_a_stream_cut_while_thinking_restarts_on_another_backend(
    resuming: Gateway, upstreams: Upstreams, second_pool: ThreadedServer
) -> None:
    set_faults(
        upstreams.vllm.url, reasoning_tokens=5, content_tokens=4, drop_after_chunks=3
    )  # role + think0-1
    set_faults(second_pool.url, reasoning_tokens=5, content_tokens=4)
    body = {"model": "two-pools", "messages": HELLO, "stream": True}
    events = sse_events(httpx.post(resuming.base_url + "/chat/completions", json=body, timeout=30).text)
    assert events[-1] == "[DONE]"
    assert stream_text(events, "reasoning") == numbered("think", 2) + numbered("think", 5), (
        "thinking restarts"
    )
    assert stream_text(events, "content") == numbered("word", 4)
    assert "continue_final_message" not in last_request(second_pool.url)
    assert settled(resuming).attempts[1].resumed == "restarted"


def test_a_route_whose_candidates_cannot_resume_ends_with_an_error_event(
    resuming: Gateway, upstreams: Upstreams
) -> None:
    set_faults(upstreams.vllm.url, reasoning_tokens=0, content_tokens=20, drop_after_chunks=5)
    body = {"model": "cannot-resume", "messages": HELLO, "stream": True}
    events = sse_events(httpx.post(resuming.base_url + "/chat/completions", json=body, timeout=30).text)
    assert events[-1]["error"]["code"] == "upstream_stream_broken"
    assert stream_text(events, "content") == numbered("word", 4)
    assert [a.backend for a in settled(resuming).attempts] == ["pool-a"]


def test_the_openai_sdk_reads_a_stream_whose_backend_was_killed(
    upstreams: Upstreams, second_pool: ThreadedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pool-a is a real process, SIGKILLed while its tokens flow to the client."""
    port = free_port()
    dying = ProcessServer(
        python_module(
            "gateway", "emulate", "--profile", "b300-vllm", "--port", str(port), "--time-scale", "1"
        ),
        log_path=str(tmp_path / "dying.log"),
    ).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health")
        set_faults(url, reasoning_tokens=0, content_tokens=300)  # ~3 s at 92 tokens/s
        httpx.delete(second_pool.url + "/emulator/faults")
        set_faults(second_pool.url, reasoning_tokens=0, content_tokens=300)
        monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
        path = tmp_path / "policy.yaml"
        path.write_text(policy(url, second_pool.url, upstreams.paid.url))
        with running_gateway(path) as gateway:
            client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
            stream = client.chat.completions.create(
                model="two-pools", messages=HELLO, stream=True, stream_options={"include_usage": True}
            )
            ids, content, usage = set(), [], None
            for chunk in stream:
                ids.add(chunk.id)
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    if choice.delta.content:
                        content.append(choice.delta.content)
                if len(content) == 20 and dying.proc is not None and dying.proc.poll() is None:
                    os.kill(dying.proc.pid, signal.SIGKILL)  # mid-stream, tokens still flowing
            text = "".join(content)
            assert len(ids) == 1
            assert text == numbered("word", 300), f"got {len(text.split())} words, first gap at " + str(
                next((i for i, w in enumerate(text.split()) if w != f"word{i}"), None)
            )
            assert usage is not None
            attempts = settled(gateway).attempts
            assert [a.backend for a in attempts] == ["pool-a", "pool-b"] and attempts[0].status == "dropped"
            assert usage.completion_tokens == sum(a.usage.completion_tokens for a in attempts if a.usage)
    finally:
        dying.stop()
