"""Tracing's small rules: the W3C traceparent read and written, the samplers by their OTEL_TRACES_SAMPLER
names, and which settings the policy and the standard environment variables give."""

from __future__ import annotations

import pytest

from gateway.policy.telemetry import Telemetry, traced
from gateway.telemetry.context import Sampler, new_trace_id, parse_traceparent, traceparent
from gateway.telemetry.settings import parsed_headers, sampler_of, telemetry_settings, traces_url

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_a_valid_traceparent_is_read_and_written_back() -> None:
    parent = parse_traceparent(f"00-{TRACE}-{SPAN}-01", " vendor=abc ")
    assert parent is not None
    assert (parent.trace_id.hex(), parent.span_id.hex(), parent.sampled) == (TRACE, SPAN, True)
    assert parent.trace_state == "vendor=abc"
    assert traceparent(parent.trace_id, parent.span_id, False) == f"00-{TRACE}-{SPAN}-00"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        f"00-{TRACE}-{SPAN}",  # no flags
        f"00-{'0' * 32}-{SPAN}-01",  # an all-zero trace id is invalid
        f"00-{TRACE}-{'0' * 16}-01",  # and so is an all-zero span id
        f"ff-{TRACE}-{SPAN}-01",  # version ff is forbidden
        f"00-{TRACE.upper()}-{SPAN}-01",  # hex must be lower case
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}x-{SPAN}-01",
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace(value: str | None) -> None:
    assert parse_traceparent(value, None) is None


def test_a_later_version_is_read_as_version_00_says() -> None:
    parent = parse_traceparent(f"01-{TRACE}-{SPAN}-01-what-comes-later", None)
    assert parent is not None and parent.trace_id.hex() == TRACE


def test_samplers_by_their_standard_names() -> None:
    sampled = parse_traceparent(f"00-{TRACE}-{SPAN}-01", None)
    unsampled = parse_traceparent(f"00-{TRACE}-{SPAN}-00", None)
    never = sampler_of(None, {"OTEL_TRACES_SAMPLER": "parentbased_always_off"})
    assert never.keeps(new_trace_id(), sampled) and not never.keeps(new_trace_id(), None)
    always = sampler_of(None, {"OTEL_TRACES_SAMPLER": "always_on"})
    assert always.keeps(new_trace_id(), unsampled), "not parent-based: the client's flag is not followed"
    assert sampler_of(None, {}) == Sampler(1.0, parent_based=True)
    ratio = sampler_of(None, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    kept = sum(ratio.keeps(new_trace_id(), None) for _ in range(4000))
    assert 700 < kept < 1300, kept  # a quarter of random trace ids, give or take
    assert sampler_of(0.0, {"OTEL_TRACES_SAMPLER": "always_on"}) == Sampler(0.0, True), "the policy wins"


def test_off_unless_an_endpoint_is_named() -> None:
    assert telemetry_settings(Telemetry(), {}) is None
    on = telemetry_settings(Telemetry(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert on is not None and on.endpoint == "http://collector:4318/v1/traces"
    assert on.service_name == "llm-gateway" and not on.content
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}
    assert telemetry_settings(Telemetry(), disabled) is None


def test_where_traces_go() -> None:
    assert traces_url("http://phoenix:6006", {}) == "http://phoenix:6006/v1/traces"
    assert traces_url("http://phoenix:6006/v1/traces/", {}) == "http://phoenix:6006/v1/traces"
    signal = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:1/custom",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://y",
    }
    assert traces_url(None, signal) == "http://x:1/custom", "the signal's own endpoint is used as it is"
    assert parsed_headers("api_key=abc%3D, x-team = blue,broken") == (("api_key", "abc="), ("x-team", "blue"))


def test_the_trace_context_goes_to_self_hosted_engines_by_default() -> None:
    assert traced("vllm", None) and traced("sglang", None) and traced("llamacpp", None)
    assert not traced("openai", None) and not traced("litellm", None)
    assert traced("openai", True) and not traced("vllm", False)


def test_a_tracestate_that_is_not_printable_ascii_is_not_passed_on() -> None:
    for state in ("a=b\r\nx-injected: 1", "a=é", "k=" + "v" * 600):
        parent = parse_traceparent(f"00-{TRACE}-{SPAN}-01", state)
        assert parent is not None and parent.trace_state == ""


def test_a_settled_request_as_spans_with_its_queue_and_a_resume_link() -> None:
    from gateway.telemetry.encode import request_messages
    from gateway.telemetry.otlp import envelope, export_body
    from gateway.telemetry.record import request_record
    from gateway.telemetry.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, TraceIds
    from gateway.values.observation import Attempt, Observation, Usage
    from tests.telemetry.receiver import spans_of

    cut = Attempt("pool-a", 10.0, status="dropped", finished_at=10.5, usage=Usage(100, 9, 3))
    resumed = Attempt("pool-b", 10.5, finished_at=11.0, usage=Usage(120, 20, 0, 64), resumed="continued")
    observation = Observation("r1", "two-pools", "chat", True, 9.0, attempts=[cut, resumed], finished_at=11.0)
    observation.queued_s = 0.75
    ids = TraceIds(bytes.fromhex(TRACE), bytes(7) + b"\x01", bytes.fromhex(SPAN), "", 1000.0)
    ids.queued.append((9.1, 9.85))
    id_values = (ids.trace_id, ids.server_span_id, ids.parent_span_id, ids.trace_state, ids.wall_offset_s)
    written = request_messages(request_record(id_values, {}, ids.queued, observation, None, {}))
    spans = spans_of(export_body(envelope({"service.name": "t"}, ("s", "1")), written))
    server, queue, first, second = spans
    assert (server.kind, queue.kind, first.kind, second.kind) == (
        KIND_SERVER,
        KIND_INTERNAL,
        KIND_CLIENT,
        KIND_CLIENT,
    )
    assert server.parent_span_id == SPAN and {queue.parent_span_id, first.parent_span_id} == {server.span_id}
    assert abs(queue.start_ns - 1_009_100_000_000) < 1000 and abs(queue.end_ns - 1_009_850_000_000) < 1000
    assert (
        server.attributes["gen_ai.usage.input_tokens"] == 220
        and server.attributes["gateway.queued_s"] == 0.75
    )
    assert server.attributes["gen_ai.usage.reasoning.output_tokens"] == 3
    assert second.attributes["gen_ai.usage.cache_read.input_tokens"] == 64
    assert first.status_code == 2 and first.attributes["error.type"] == "dropped"
    assert second.links == [(TRACE, first.span_id, {"gateway.link": "resumes"})]


def test_batching_from_the_standard_variables_where_the_policy_is_silent() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    standard = {
        **endpoint,
        "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128",
        "OTEL_BSP_SCHEDULE_DELAY": "250",  # milliseconds, as the specification's are
        "OTEL_BSP_EXPORT_TIMEOUT": "30000",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "7000",  # the exporter's own timeout comes before the processor's
    }
    read = telemetry_settings(Telemetry(), standard)
    assert read is not None
    assert (read.max_queued_traces, read.batch_traces) == (4096, 128)
    assert (read.flush_interval_s, read.export_timeout_s) == (0.25, 7.0)
    policy = Telemetry.model_validate({"batch_traces": 16, "flush_interval_s": 2.0})
    mixed = telemetry_settings(policy, standard)
    assert mixed is not None and (mixed.batch_traces, mixed.flush_interval_s) == (16, 2.0), "the policy wins"
    assert mixed.max_queued_traces == 4096
    unset = telemetry_settings(Telemetry(), endpoint)
    assert unset is not None and (unset.max_queued_traces, unset.batch_traces) == (2048, 1024)


@pytest.mark.parametrize("value", ["lots", "0", "-5", "inf", "nan", "2000000"])
def test_a_standard_variable_the_policy_would_refuse_is_passed_over(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_BSP_MAX_QUEUE_SIZE": value}
    read = telemetry_settings(Telemetry(), environ)
    assert read is not None and read.max_queued_traces == 2048
    assert "OTEL_BSP_MAX_QUEUE_SIZE" in caplog.text
