"""A real trace store receives the gateway's traces: Arize Phoenix (`phoenix serve`, from its own cached
virtual environment: `bash tests/telemetry/setup_phoenix.sh`; until it has run these tests skip), started
here on free ports with a working directory of its own. A streamed request that fell back once and a
stream resumed on another backend are read back through Phoenix's REST API, and their spans' parentage,
attributes, tokens and cost are checked against the ledger's row (and the resumed one's prompt and answer,
``telemetry.content``, against what the client sent and read)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.emulator import create_emulator_app
from tests.conftest import PAID_KEY, TIME_SCALE, Gateway, Upstreams, running_gateway
from tests.servers import ThreadedServer, threaded_server
from tests.spend.conftest import ledger_rows
from tests.telemetry.phoenix import SETUP, phoenix_python, running_phoenix
from tests.test_resume import policy, set_faults, sse_events, stream_text

pytestmark = pytest.mark.slow

CLIENT_SPAN = "00f067aa0ba902b7"
HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = phoenix_python()
    if python is None:
        pytest.skip(f"Arize Phoenix is not installed: run `bash {SETUP}`")
    with running_phoenix(python, tmp_path_factory.mktemp("phoenix")) as url:
        yield url


@pytest.fixture(scope="module")
def second_pool() -> Iterator[ThreadedServer]:
    with threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=7)) as server:
        yield server


@pytest.fixture
def traced(
    phoenix: str,
    upstreams: Upstreams,
    second_pool: ThreadedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Gateway]:
    upstreams.reset()
    for server in (second_pool,):
        httpx.delete(server.url + "/emulator/faults")
        httpx.delete(server.url + "/emulator/requests")
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    text = policy(upstreams.vllm.url, second_pool.url, upstreams.paid.url)
    text += f"telemetry: {{otlp_endpoint: '{phoenix}', flush_interval_s: 0.1, content: true}}\n"
    text += "ledger: {flush_interval_s: 0.05}\n"
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def stream(gateway: Gateway, route: str, trace_id: str) -> httpx.Response:
    body = {"model": route, "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert sse_events(response.text)[-1] == "[DONE]"
    return response


def ledger_row(gateway: Gateway, request_id: str) -> Any:
    ledger = gateway.policy_path.parent / "ledger.sqlite3"
    deadline = time.monotonic() + 20
    while True:
        rows = ledger_rows(ledger, "request_id = ?", (request_id,)) if ledger.exists() else []
        if rows:
            return rows[0]
        assert time.monotonic() < deadline, "no ledger row"
        time.sleep(0.05)


def phoenix_spans(phoenix: str, trace_id: str, count: int) -> list[dict[str, Any]]:
    """The trace's spans as Phoenix stored them (it ingests asynchronously: waited for)."""
    deadline = time.monotonic() + 60
    while True:
        reply = httpx.get(f"{phoenix}/v1/projects/default/spans", params={"trace_id": trace_id, "limit": 100})
        spans: list[dict[str, Any]] = reply.json()["data"] if reply.status_code == 200 else []
        if len(spans) >= count:
            return spans
        assert time.monotonic() < deadline, (
            f"Phoenix holds {len(spans)} of the trace's {count} spans: {reply.text}"
        )
        time.sleep(0.2)


def split(spans: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server span and the attempts' spans, in the order they started."""
    (server,) = [s for s in spans if s["parent_id"] == CLIENT_SPAN]
    attempts = [s for s in spans if s["parent_id"] == server["context"]["span_id"]]
    return server, sorted(attempts, key=lambda s: s["attributes"]["gateway.attempt"])


def assert_totals_match(server: dict[str, Any], row: Any) -> None:
    attrs = server["attributes"]
    assert attrs["gateway.request_id"] == row["request_id"]
    assert attrs["gateway.attempts"] == row["attempts"]
    assert attrs["gateway.backend"] == row["backend"]
    assert attrs["gen_ai.usage.input_tokens"] == row["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == row["completion_tokens"]
    assert attrs["gen_ai.usage.reasoning.output_tokens"] == row["reasoning_tokens"]
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == row["cached_prompt_tokens"]
    assert attrs["gateway.cost_usd"] == pytest.approx(row["cost_usd"])
    assert row["cost_usd"] > 0


def assert_attempts_match(attempts: list[dict[str, Any]], row: Any) -> None:
    logged = orjson.loads(row["attempt_log"])
    assert len(attempts) == len(logged)
    for span, entry in zip(attempts, logged, strict=True):
        attrs = span["attributes"]
        assert attrs["gateway.backend"] == entry["backend"]
        assert attrs["gateway.attempt.status"] == entry["status"]
        assert attrs.get("gen_ai.usage.input_tokens", 0) == entry["prompt_tokens"]
        assert attrs.get("gen_ai.usage.output_tokens", 0) == entry["completion_tokens"]
        assert attrs.get("gateway.cost_usd", 0.0) == pytest.approx(entry["cost_usd"])


def test_a_streamed_request_that_fell_back_once(traced: Gateway, phoenix: str, upstreams: Upstreams) -> None:
    # pool-a answers 500 before any byte: the stream falls back to the paid API.
    set_faults(upstreams.vllm.url, error_rate=1.0, error_status=500)
    set_faults(upstreams.paid.url, reasoning_tokens=3, content_tokens=8)
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    response = stream(traced, "pool-then-api", trace_id)
    assert response.headers["x-gateway-backend"] == "api" and response.headers["x-gateway-attempts"] == "2"
    row = ledger_row(traced, response.headers["x-request-id"])
    server, attempts = split(phoenix_spans(phoenix, trace_id, 3))
    assert server["context"]["trace_id"] == trace_id
    assert server["attributes"]["gateway.decision.reason"] == row["decision_reason"]
    assert server["events"][0]["name"] == "gateway.decision"
    candidates = [
        e["attributes"]["gateway.backend"] for e in server["events"] if e["name"] == "gateway.candidate"
    ]
    assert sorted(candidates) == ["api", "pool-a"]
    assert_totals_match(server, row)
    assert_attempts_match(attempts, row)
    failed, answered = attempts
    assert failed["status_code"] == "ERROR" and failed["attributes"]["http.response.status_code"] == 500
    assert failed["attributes"]["gateway.dialect"] == "vllm"
    assert answered["status_code"] != "ERROR" and answered["attributes"]["gen_ai.provider.name"] == "openai"
    assert answered["attributes"]["gen_ai.usage.reasoning.output_tokens"] == 3
    assert answered["attributes"]["gen_ai.response.time_to_first_chunk"] > 0
    # The engine was handed the failed attempt's span as its parent; the paid API got no trace context.
    (to_pool,) = [
        r["headers"]
        for r in httpx.get(upstreams.vllm.url + "/emulator/requests").json()
        if r["path"].endswith("/chat/completions")
    ]
    assert to_pool["traceparent"] == f"00-{trace_id}-{failed['context']['span_id']}-01"
    to_api = [
        r["headers"]
        for r in httpx.get(upstreams.paid.url + "/emulator/requests").json()
        if r["path"].endswith("/chat/completions")
    ]
    assert to_api and not any("traceparent" in headers for headers in to_api)


def test_a_resumed_stream(
    traced: Gateway, phoenix: str, upstreams: Upstreams, second_pool: ThreadedServer
) -> None:
    # pool-a sends its role chunk, 3 thinking tokens and word0..word5, then the connection drops.
    set_faults(upstreams.vllm.url, reasoning_tokens=3, content_tokens=20, drop_after_chunks=10)
    set_faults(second_pool.url, reasoning_tokens=3, content_tokens=20)
    trace_id = "6bf92f3577b34da6a3ce929d0e0e4736"
    response = stream(traced, "two-pools", trace_id)
    row = ledger_row(traced, response.headers["x-request-id"])
    server, attempts = split(phoenix_spans(phoenix, trace_id, 3))
    assert_totals_match(server, row)
    assert_attempts_match(attempts, row)
    cut, resumed = attempts
    assert cut["attributes"]["gateway.attempt.status"] == "dropped" and cut["status_code"] == "ERROR"
    assert resumed["attributes"]["gateway.resumed"] == "continued"
    assert resumed["attributes"]["gateway.resumes_span_id"] == cut["context"]["span_id"]
    assert cut["end_time"] <= resumed["start_time"]
    # The answer (telemetry.content): what the client read, both backends' parts of it as one message.
    (said,) = orjson.loads(server["attributes"]["gen_ai.output.messages"])
    read = stream_text(sse_events(response.text), "content")
    assert "word0" in read and said["parts"] == [{"type": "text", "content": read}]
    assert said["finish_reason"] in ("stop", "length")
    assert orjson.loads(server["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": HELLO[0]["content"]}]}
    ]
    # Both engines saw the trace: each under its own attempt's span.
    for url, span in ((upstreams.vllm.url, cut), (second_pool.url, resumed)):
        (headers,) = [
            r["headers"]
            for r in httpx.get(url + "/emulator/requests").json()
            if r["path"].endswith("/chat/completions")
        ]
        assert headers["traceparent"] == f"00-{trace_id}-{span['context']['span_id']}-01"
