"""The trace context from the client to the engine: a client's W3C traceparent is continued by the
gateway's server span and sent on to a self-hosted engine (the vLLM-dialect emulator records every
header it gets) under the attempt's own span; a paid API gets none unless its backend says
``trace_context: true``. Prompts and answers (streamed or whole) go into spans only with
``telemetry.content: true``, and never for a route marked ``private``. With no telemetry section nothing
of this happens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.emulator import create_emulator_app
from gateway.measure.probes import PROBE_PROMPT
from tests.conftest import PAID_KEY, TIME_SCALE, Gateway, Upstreams, policy_yaml, running_gateway
from tests.servers import ThreadedServer, threaded_server
from tests.telemetry.receiver import ReadSpan, Receiver, otlp_receiver
from tests.test_resume import policy, set_faults

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
HI = [{"role": "user", "content": "a prompt only the client should see"}]
KIND_SERVER, KIND_CLIENT = 2, 3


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, ThreadedServer]]:
    with otlp_receiver() as found:
        yield found


@contextmanager
def traced_gateway(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    telemetry: str | None,
    *,
    paid_trace_context: bool = False,
    private_route: bool = False,
    keep_environment: bool = False,
) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    if not keep_environment:  # the policy alone says whether tracing is on
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_SDK_DISABLED",
        ):
            monkeypatch.delenv(name, raising=False)
    text = policy_yaml(upstreams)
    if paid_trace_context:
        text = text.replace(
            "    api_key_env: TEST_PAID_API_KEY\n",
            "    api_key_env: TEST_PAID_API_KEY\n    trace_context: true\n",
        )
    if private_route:
        text = text.replace(
            "  vllm-only:\n    backends: [b300-vllm]\n",
            "  vllm-only:\n    backends: [b300-vllm]\n    private: true\n",
        )
    path = tmp_path / "policy.yaml"
    path.write_text(text + "tuning: {probes: {on_start: false}}\n" + (telemetry or ""))
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def telemetry_to(server: ThreadedServer, extra: str = "") -> str:
    return f"telemetry: {{otlp_endpoint: '{server.url}', flush_interval_s: 0.05{extra}}}\n"


def chat(
    gateway: Gateway, route: str, headers: dict[str, str] | None = None, stream: bool = True
) -> httpx.Response:
    body = {"model": route, "messages": HI, "stream": stream, "max_tokens": 20}
    response = httpx.post(
        gateway.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response


def upstream_headers(server: ThreadedServer) -> list[dict[str, str]]:
    """The headers of the completions an emulator received (its probes' aside)."""
    entries = httpx.get(server.url + "/emulator/requests").json()
    return [
        e["headers"]
        for e in entries
        if e["path"].endswith("/chat/completions") and PROBE_PROMPT not in json.dumps(e["body"])
    ]


def trace_of(receiver: Receiver, trace_id: str, count: int) -> list[ReadSpan]:
    def complete(spans: list[ReadSpan]) -> bool:
        return len([s for s in spans if s.trace_id == trace_id]) >= count

    return [s for s in receiver.wait_for(complete) if s.trace_id == trace_id]


def test_the_clients_traceparent_is_continued_and_sent_to_the_vllm_engine(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
) -> None:
    sink, server = receiver
    with traced_gateway(upstreams, tmp_path, monkeypatch, telemetry_to(server)) as gateway:
        chat(gateway, "vllm-only", {"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=abc"})
        (sent,) = upstream_headers(upstreams.vllm)
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01"), "the client's trace, sampled"
    assert span_id != CLIENT_SPAN, "the engine's parent is the gateway's attempt span, not the client's"
    assert sent["tracestate"] == "vendor=abc"
    spans = trace_of(sink, CLIENT_TRACE, 2)
    (server_span,) = [s for s in spans if s.kind == KIND_SERVER]
    (attempt,) = [s for s in spans if s.kind == KIND_CLIENT]
    assert server_span.parent_span_id == CLIENT_SPAN, "the server span continues the client's"
    assert attempt.span_id == span_id and attempt.parent_span_id == server_span.span_id
    assert attempt.attributes["gateway.backend"] == "b300-vllm"
    assert attempt.attributes["gen_ai.provider.name"] == "vllm"
    assert server_span.attributes["gen_ai.request.model"] == "vllm-only"
    assert sink.content_types and set(sink.content_types) == {"application/x-protobuf"}


def test_a_request_without_traceparent_starts_a_new_trace(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
) -> None:
    sink, server = receiver
    with traced_gateway(upstreams, tmp_path, monkeypatch, telemetry_to(server)) as gateway:
        chat(gateway, "vllm-only", stream=False)
        (sent,) = upstream_headers(upstreams.vllm)
    _, trace_id, span_id, _ = sent["traceparent"].split("-")
    assert trace_id != CLIENT_TRACE and "tracestate" not in sent
    spans = trace_of(sink, trace_id, 2)
    (server_span,) = [s for s in spans if s.kind == KIND_SERVER]
    assert server_span.parent_span_id == "", "a root span: the gateway began this trace"
    assert [s.span_id for s in spans if s.kind == KIND_CLIENT] == [span_id]


@pytest.mark.parametrize("trace_context", [False, True])
def test_a_paid_api_gets_the_trace_context_only_when_its_backend_says_so(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
    trace_context: bool,
) -> None:
    _, server = receiver
    with traced_gateway(
        upstreams, tmp_path, monkeypatch, telemetry_to(server), paid_trace_context=trace_context
    ) as gateway:
        chat(gateway, "paid-only", {"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=abc"})
        (sent,) = upstream_headers(upstreams.paid)
    if trace_context:
        assert sent["traceparent"].split("-")[1] == CLIENT_TRACE and sent["tracestate"] == "vendor=abc"
    else:
        assert "traceparent" not in sent and "tracestate" not in sent


def test_off_by_default_no_trace_context_goes_anywhere(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with traced_gateway(upstreams, tmp_path, monkeypatch, None) as gateway:
        assert gateway.runtime.tracer is None
        chat(gateway, "vllm-only", {"traceparent": CLIENT_TRACEPARENT})
        (sent,) = upstream_headers(upstreams.vllm)
    assert "traceparent" not in sent


def test_the_standard_environment_variables_turn_it_on(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
) -> None:
    sink, server = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    with traced_gateway(upstreams, tmp_path, monkeypatch, None, keep_environment=True) as gateway:
        chat(gateway, "vllm-only", {"traceparent": CLIENT_TRACEPARENT})
    spans = trace_of(sink, CLIENT_TRACE, 2)
    assert {s.resource["service.name"] for s in spans} == {"gateway-under-test"}


def answer_text(response: httpx.Response, stream: bool) -> str:
    """The answer the client read: a whole answer's content, or a stream's content deltas joined."""
    if not stream:
        return str(response.json()["choices"][0]["message"]["content"])
    parts = []
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


@pytest.mark.parametrize(
    ("content", "private", "stream", "expected"),
    [
        (False, False, True, False),
        (True, False, True, True),
        (True, False, False, True),
        (True, True, True, False),
        (True, True, False, False),
    ],
)
def test_prompts_and_answers_go_into_spans_only_when_asked_and_never_for_a_private_route(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
    content: bool,
    private: bool,
    stream: bool,
    expected: bool,
) -> None:
    sink, server = receiver
    telemetry = telemetry_to(server, ", content: true" if content else "")
    with traced_gateway(upstreams, tmp_path, monkeypatch, telemetry, private_route=private) as gateway:
        set_faults(upstreams.vllm.url, reasoning_tokens=2, content_tokens=12)  # within max_tokens
        answer = answer_text(chat(gateway, "vllm-only", {"traceparent": CLIENT_TRACEPARENT}, stream), stream)
    assert len(answer) > 20, "the emulator answers in words"
    spans = trace_of(sink, CLIENT_TRACE, 2)
    everything = json.dumps([(s.attributes, s.events) for s in spans])
    assert ("a prompt only the client should see" in everything) is expected
    assert (answer in everything) is expected
    (server_span,) = [s for s in spans if s.kind == KIND_SERVER]
    if expected:
        # The prompt as the conventions' input messages: the client's message as parts.
        assert json.loads(server_span.attributes["gen_ai.input.messages"]) == [
            {"role": "user", "parts": [{"type": "text", "content": HI[0]["content"]}]}
        ]
        # The GenAI semantic conventions' output message: the answer the client read, and why it ended.
        (said,) = json.loads(server_span.attributes["gen_ai.output.messages"])
        assert said["role"] == "assistant" and said["parts"] == [{"type": "text", "content": answer}]
        assert said["finish_reason"] in ("stop", "length")
    else:
        assert "gen_ai.output.messages" not in server_span.attributes


def test_a_resumed_attempt_links_to_the_attempt_it_took_over(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
) -> None:
    sink, server = receiver
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    with threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=7)) as pool_b:
        path = tmp_path / "policy.yaml"
        path.write_text(policy(upstreams.vllm.url, pool_b.url, upstreams.paid.url) + telemetry_to(server))
        set_faults(upstreams.vllm.url, reasoning_tokens=3, content_tokens=20, drop_after_chunks=10)
        with running_gateway(path) as gateway:
            body = {"model": "two-pools", "messages": HI, "stream": True}
            headers = {"traceparent": CLIENT_TRACEPARENT}
            response = httpx.post(
                gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30
            )
            assert response.status_code == 200 and response.text.rstrip().endswith("[DONE]")
    upstreams.reset()
    spans = trace_of(sink, CLIENT_TRACE, 3)
    cut, resumed = sorted(
        (s for s in spans if s.kind == KIND_CLIENT), key=lambda s: s.attributes["gateway.attempt"]
    )
    assert cut.attributes["gateway.attempt.status"] == "dropped" and cut.status_code == 2  # ERROR
    assert resumed.attributes["gateway.resumed"] == "continued"
    assert resumed.links == [(CLIENT_TRACE, cut.span_id, {"gateway.link": "resumes"})]


def test_each_probe_is_a_trace_of_its_own(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[Receiver, ThreadedServer],
) -> None:
    sink, server = receiver
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + telemetry_to(server))  # start-up probes on
    with running_gateway(path):
        spans = sink.wait_for(lambda found: {s.name for s in found} >= {"probe b300-vllm", "probe paid-api"})
    upstreams.reset()
    probes = [s for s in spans if s.attributes.get("gateway.probe")]
    assert probes and all(s.parent_span_id == "" and s.kind == KIND_CLIENT for s in probes)
    assert len({s.trace_id for s in probes}) == len(probes), "one trace per probe"
