"""The policy's ``telemetry`` section: where the gateway sends its OpenTelemetry traces, and what they
may hold. Read once at start-up (a reload does not start or stop tracing); the standard ``OTEL_*``
environment variables fill in what the policy leaves out (``gateway.telemetry.settings``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway.policy.strict import PositiveFloat, Strict


class Telemetry(Strict):
    """Off unless an endpoint is given here or in OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT."""

    # An OTLP/HTTP receiver (Phoenix, the OpenTelemetry Collector, Tempo, Jaeger): its base URL
    # (``/v1/traces`` is added) or the full traces URL.
    otlp_endpoint: Annotated[str, Field(pattern=r"^https?://")] | None = None
    # Share of new traces kept; a client's sampled traceparent is always followed. Unset:
    # OTEL_TRACES_SAMPLER(_ARG), else every trace.
    sample_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    service_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # else OTEL_SERVICE_NAME
    # Prompts and answers in the spans (gen_ai.input.messages, gen_ai.output.messages: at most 32,768
    # characters of answer); never for a route marked ``private``.
    content: bool = False
    # Finished requests waiting for the exporter; past it a request's spans are dropped (and counted).
    max_queued_traces: Annotated[int, Field(ge=1, le=1_000_000)] = 2048
    # Requests per OTLP export (at most ``MAX_POST_BYTES`` of spans, exporter.py). 1,024 rather than 256:
    # fewer posts measured 4% cheaper on one VM, though on a later one 256-4,096 read alike
    # (docs/performance.md, "The post, looked at again" and "What a traced whole answer costs").
    batch_traces: Annotated[int, Field(ge=1, le=100_000)] = 1024
    flush_interval_s: PositiveFloat = 1.0
    export_timeout_s: PositiveFloat = 5.0


# The self-hosted engines: vLLM and SGLang put their own spans under a W3C traceparent
# (docs/contracts/*.yaml, ``tracing``); llama-server ignores it, harmlessly (a tracing proxy in front of
# it may not). The trace context goes to them unless the backend says otherwise; never, by default, to a
# paid API, which would learn which requests belong together.
TRACED_DIALECTS = ("vllm", "sglang", "llamacpp")


def traced(dialect: str, trace_context: bool | None) -> bool:
    """Whether a backend of ``dialect`` is sent the trace context (``Backend.trace_context``)."""
    return dialect in TRACED_DIALECTS if trace_context is None else trace_context
