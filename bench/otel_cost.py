"""What one traced request costs in CPU, our OTLP writer against the OpenTelemetry SDK's, to choose one.

    .venv/bin/python -m bench.otel_cost ours
    <a venv with opentelemetry-sdk and -exporter-otlp-proto-http>/bin/python bench/otel_cost.py sdk

Each side makes the same trace as a gateway request with one fallback does (a server span with the
decision's events, two client spans, ~15 attributes each) and encodes it as the OTLP/HTTP protobuf body,
``REQUESTS`` times; it prints CPU microseconds per request for making the spans and for encoding them
(no network: the post is the same HTTP request either way). The SDK side imports nothing of the gateway,
so it runs in any environment that has the SDK (tests/telemetry/setup_phoenix.sh's has it).
"""

from __future__ import annotations

import sys
import time
from typing import Any

REQUESTS = 5000
SERVER_ATTRS: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "kimi-k3",
    "gen_ai.request.stream": True,
    "gen_ai.request.max_tokens": 1024,
    "gateway.request_id": "fa828155018c000000000001",
    "gateway.route": "kimi-k3",
    "gateway.status": "ok",
    "gateway.attempts": 2,
    "gateway.cost_usd": 0.00039,
    "gateway.queued_s": 0.0,
    "gateway.decision.reason": "fallback_after_upstream_error",
    "gen_ai.usage.input_tokens": 1200,
    "gen_ai.usage.output_tokens": 96,
    "gen_ai.usage.cache_read.input_tokens": 1024,
    "gen_ai.usage.reasoning.output_tokens": 64,
}
CLIENT_ATTRS: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "moonshotai/Kimi-K3",
    "gen_ai.provider.name": "vllm",
    "gateway.backend": "b300-vllm",
    "gateway.dialect": "vllm",
    "gateway.attempt.status": "ok",
    "server.address": "10.0.0.5",
    "server.port": 8000,
    "gen_ai.response.time_to_first_chunk": 0.25,
    "gateway.cost_usd": 0.0002,
    "gateway.cost_basis": "gpu_hours_amortized",
    "gen_ai.usage.input_tokens": 600,
    "gen_ai.usage.output_tokens": 48,
    "gen_ai.usage.cache_read.input_tokens": 512,
    "gen_ai.usage.reasoning.output_tokens": 32,
}
EVENTS: list[tuple[str, dict[str, Any]]] = [
    (
        "gateway.decision",
        {"gateway.decision.reason": "cheapest_feasible", "gateway.decision.order": ["a", "b"]},
    ),
    ("gateway.candidate", {"gateway.backend": "a", "gateway.candidate.predicted_ttft_p95_s": 0.3}),
    ("gateway.candidate", {"gateway.backend": "b", "gateway.candidate.predicted_ttft_p95_s": 0.5}),
]


def ours() -> tuple[float, float]:
    from gateway.telemetry.context import new_span_id, new_trace_id
    from gateway.telemetry.otlp import export_request
    from gateway.telemetry.spans import KIND_CLIENT, KIND_SERVER, Event, Span

    def make() -> list[Span]:
        trace_id, server_id, now = new_trace_id(), new_span_id(), time.time_ns()
        server = Span(
            trace_id, server_id, b"", "chat kimi-k3", KIND_SERVER, now, now + 1000, dict(SERVER_ATTRS)
        )
        server.events = [Event(name, now, dict(attrs)) for name, attrs in EVENTS]
        clients = [
            Span(
                trace_id,
                new_span_id(),
                server_id,
                "chat moonshotai/Kimi-K3",
                KIND_CLIENT,
                now,
                now + 500,
                dict(CLIENT_ATTRS),
            )
            for _ in range(2)
        ]
        return [server, *clients]

    started = time.process_time()
    traces = [make() for _ in range(REQUESTS)]
    made = time.process_time()
    resource = {"service.name": "llm-gateway"}
    for trace in traces:
        export_request(resource, ("gateway.telemetry", "1"), trace)
    return made - started, time.process_time() - made


def sdk() -> tuple[float, float]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind, set_span_in_context

    finished: list[ReadableSpan] = []

    class Keep(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            finished.extend(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = provider.get_tracer("gateway.telemetry")
    started = time.process_time()
    for _ in range(REQUESTS):
        server = tracer.start_span("chat kimi-k3", kind=SpanKind.SERVER, attributes=SERVER_ATTRS)
        for name, attrs in EVENTS:
            server.add_event(name, attrs)
        context = set_span_in_context(server)
        for _ in range(2):
            tracer.start_span("chat moonshotai/Kimi-K3", context, SpanKind.CLIENT, CLIENT_ATTRS).end()
        server.end()
    made = time.process_time()
    for index in range(0, len(finished), 3):
        encode_spans(finished[index : index + 3]).SerializePartialToString()
    return made - started, time.process_time() - made


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "ours"
    make_s, encode_s = ours() if which == "ours" else sdk()
    per = 1e6 / REQUESTS
    print(
        f"{which}: {make_s * per:.1f} us/request making spans, {encode_s * per:.1f} us/request encoding "
        f"OTLP protobuf, {(make_s + encode_s) * per:.1f} us/request in all ({REQUESTS} requests)"
    )
