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
    """The gateway's way: the request path takes a flat record of the settled request
    (``gateway.telemetry.record``; "making spans" here is making the request's own objects, which the
    gateway makes anyway, and that record), and its spans are written from it straight to OTLP bytes
    (``gateway.telemetry.encode``)."""
    from gateway.policy.decide import Decision
    from gateway.policy.evaluate import CandidateEval
    from gateway.policy.schema import Slo
    from gateway.telemetry.context import new_span_id, new_trace_id
    from gateway.telemetry.encode import request_messages
    from gateway.telemetry.otlp import envelope, export_body
    from gateway.telemetry.record import RequestRecord, request_record
    from gateway.values.observation import Attempt, Observation, Usage

    def candidate(name: str) -> CandidateEval:
        return CandidateEval(
            name, True, True, True, 0.3, 0.3, 90.0, 0.0, 15.0, 0.0002, 48.0, True, True, None, None, 100,
            None, (), Slo(),
        )  # fmt: skip

    evals = (candidate("a"), candidate("b"))
    backends: dict[str, Any] = {}

    def make(index: int) -> RequestRecord:
        ids = (new_trace_id(), new_span_id(), b"", "", 1.7e9)
        failed = Attempt("a", 10.0, status="upstream_error", http_status=503, finished_at=10.1)
        answered = Attempt(
            "b",
            10.1,
            http_status=200,
            ttft_s=0.25,
            finished_at=11.0,
            usage=Usage(600, 48, 32, 512),
            cost_usd=0.0002,
            cost_basis="gpu_hours_amortized",
        )
        observation = Observation(
            f"{index:024x}",
            "kimi-k3",
            "chat",
            True,
            9.99,
            max_tokens=1024,
            decision_reason="cheapest_within_slo",
            attempts=[failed, answered],
            finished_at=11.0,
            cost_usd=0.00039,
        )
        decision = Decision(("a", "b"), "cheapest_within_slo", evals, 0.0002)
        return request_record(ids, {}, (), observation, decision, backends)

    started = time.process_time()
    settled = [make(index) for index in range(REQUESTS)]
    made = time.process_time()
    parts = envelope({"service.name": "llm-gateway"}, ("gateway.telemetry", "1"))
    for record in settled:
        export_body(parts, request_messages(record))
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
