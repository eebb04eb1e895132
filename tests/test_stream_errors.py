"""An engine error mid-stream is a failed attempt, whatever follows it on the wire.

vLLM and SGLang end a stream whose generation failed with ``data: {"error": ...}`` and then ``data: [DONE]``
(SGLang with its usage chunk between); the emulators' ``error_after_chunks`` fault does the same. The
client must never read that as a finished answer: the stream is resumed on a candidate of the same family
where the route allows, else it ends with an error event (and no [DONE]); either way the attempt is
``upstream_error`` in the ledger and counts against the backend's circuit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.emulator import create_emulator_app
from tests.conftest import TIME_SCALE, Gateway, Upstreams, running_gateway
from tests.servers import ThreadedServer, threaded_server
from tests.spend.conftest import ledger_rows
from tests.test_resume import HELLO, last_request, numbered, set_faults, settled, sse_events, stream_text

# Tokens paced ~40 ms apart: the error event must come after the stream's first read (an error within
# the first read is answered from elsewhere before a byte is sent, which the last test shows).
PACED = 200


def pool(name: str, url: str, dialect: str) -> str:
    return f"""
  {name}:
    dialect: {dialect}
    url: {url}/v1
    model: moonshotai/Kimi-K3
    family: kimi-k3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}  # generous: the machine is shared"""


@pytest.fixture(scope="module")
def other_pools() -> Iterator[tuple[ThreadedServer, ThreadedServer]]:
    """A second vLLM pool (where a cut stream goes on) and an SGLang pool (an engine that fails)."""
    with (
        threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=11)) as vllm,
        threaded_server(create_emulator_app("h200-sglang", time_scale=TIME_SCALE, seed=12)) as sglang,
    ):
        yield vllm, sglang


@pytest.fixture
def gateway(
    upstreams: Upstreams, other_pools: tuple[ThreadedServer, ThreadedServer], tmp_path: Path
) -> Iterator[Gateway]:
    second, sglang = other_pools
    for server in (upstreams.vllm, second, sglang):
        httpx.delete(server.url + "/emulator/faults")
        httpx.delete(server.url + "/emulator/requests")
    path = tmp_path / "policy.yaml"
    backends = (
        pool("pool-a", upstreams.vllm.url, "vllm")
        + pool("pool-b", second.url, "vllm")
        + pool("sglang-pool", sglang.url, "sglang")
    )
    path.write_text(f"""
backends:{backends}
routes:
  two-pools:
    backends: [pool-a, pool-b]
    exploration: 0
  sglang-then-vllm:
    backends: [sglang-pool, pool-b]
    exploration: 0
  pool-a-only:
    backends: [pool-a]
  sglang-only:
    backends: [sglang-pool]
ledger: {{flush_interval_s: 0.05}}
tuning:
  probes: {{enabled: false}}
  circuit: {{failure_threshold: 1, base_cooldown_s: 600, max_cooldown_s: 600}}  # one failure opens it
""")
    with running_gateway(path) as running:
        yield running
    upstreams.reset()


def ledger_row(gateway: Gateway) -> Any:
    ledger = gateway.policy_path.parent / "ledger.sqlite3"
    deadline = time.monotonic() + 15
    while not (ledger.exists() and ledger_rows(ledger)):
        assert time.monotonic() < deadline, "no ledger row"
        time.sleep(0.05)
    (row,) = ledger_rows(ledger)
    return row


def ask(gateway: Gateway, route: str) -> httpx.Response:
    body = {"model": route, "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize(("route", "failing"), [("two-pools", "pool-a"), ("sglang-then-vllm", "sglang-pool")])
def test_an_error_event_then_done_is_resumed_on_a_candidate_of_the_same_family(
    gateway: Gateway,
    upstreams: Upstreams,
    other_pools: tuple[ThreadedServer, ThreadedServer],
    route: str,
    failing: str,
) -> None:
    second, sglang = other_pools
    failing_url = upstreams.vllm.url if failing == "pool-a" else sglang.url
    # The role chunk, 2 thinking tokens and word0..word4, then the engine's error event and [DONE].
    set_faults(failing_url, reasoning_tokens=2, content_tokens=20, error_after_chunks=8, slowdown=PACED)
    set_faults(second.url, reasoning_tokens=2, content_tokens=20)
    response = ask(gateway, route)
    assert response.status_code == 200 and response.headers["x-gateway-backend"] == failing
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
    assert stream_text(events, "content") == numbered("word", 20), "the answer, whole, each word once"
    assert last_request(second.url)["messages"][-1]["content"] == numbered("word", 5)
    attempts = settled(gateway).attempts
    assert [(a.backend, a.status) for a in attempts] == [(failing, "upstream_error"), ("pool-b", "ok")]
    assert attempts[0].http_status == 500 and "mid-stream" in (attempts[0].error or "")
    row = ledger_row(gateway)
    logged = orjson.loads(row["attempt_log"])
    assert [(a["backend"], a["status"]) for a in logged] == [(failing, "upstream_error"), ("pool-b", "ok")]
    assert row["status"] == "ok"
    assert gateway.runtime.stats.view(failing).circuit == "open", "the circuit heard of it"


@pytest.mark.parametrize(("route", "failing"), [("pool-a-only", "pool-a"), ("sglang-only", "sglang-pool")])
def test_an_error_event_then_done_ends_with_an_error_event_where_nothing_can_resume(
    gateway: Gateway,
    upstreams: Upstreams,
    other_pools: tuple[ThreadedServer, ThreadedServer],
    route: str,
    failing: str,
) -> None:
    failing_url = upstreams.vllm.url if failing == "pool-a" else other_pools[1].url
    set_faults(failing_url, reasoning_tokens=0, content_tokens=20, error_after_chunks=5, slowdown=PACED)
    response = ask(gateway, route)
    assert response.status_code == 200
    events = sse_events(response.text)
    assert "[DONE]" not in events, "a cut answer never ends clean"
    assert events[-1]["error"]["code"] == "upstream_stream_error", events[-1]
    assert stream_text(events, "content") == numbered("word", 4)
    assert "http" not in events[-1]["error"]["message"]
    observation = settled(gateway)
    assert [(a.backend, a.status) for a in observation.attempts] == [(failing, "upstream_error")]
    row = ledger_row(gateway)
    assert (row["status"], row["error_type"]) == ("error", "upstream_error")
    assert [a["status"] for a in orjson.loads(row["attempt_log"])] == ["upstream_error"]
    assert gateway.runtime.stats.view(failing).circuit == "open", "the circuit heard of it"
    metrics = httpx.get(gateway.url + "/metrics", timeout=10).text
    assert f'gateway_upstream_errors_total{{backend="{failing}"' in metrics


def test_the_openai_sdk_raises_on_the_error_event(gateway: Gateway, upstreams: Upstreams) -> None:
    """What an OpenAI client does with the gateway's error event: raises, after the words it had."""
    set_faults(
        upstreams.vllm.url, reasoning_tokens=0, content_tokens=20, error_after_chunks=5, slowdown=PACED
    )
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    words: list[str] = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for chunk in client.chat.completions.create(model="pool-a-only", messages=HELLO, stream=True):
            words.extend(c.delta.content for c in chunk.choices if c.delta.content)
    assert "".join(words) == numbered("word", 4)


def test_an_error_before_the_first_token_falls_back_before_a_byte_is_sent(
    gateway: Gateway, upstreams: Upstreams, other_pools: tuple[ThreadedServer, ThreadedServer]
) -> None:
    set_faults(upstreams.vllm.url, reasoning_tokens=0, content_tokens=5, error_after_chunks=0)
    set_faults(other_pools[0].url, reasoning_tokens=0, content_tokens=5)
    response = ask(gateway, "two-pools")
    assert response.status_code == 200 and response.headers["x-gateway-backend"] == "pool-b"
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and stream_text(events, "content") == numbered("word", 5)
    attempts = settled(gateway).attempts
    assert [(a.backend, a.status) for a in attempts] == [("pool-a", "upstream_error"), ("pool-b", "ok")]
