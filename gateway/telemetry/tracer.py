"""The tracer the runtime holds when tracing is on, and the ``RequestTrace`` each request carries.

On the request path it does three small things: reads the client's traceparent and samples at arrival
(``begin``), gives each attempt's call its traceparent (``headers``, for backends that take one) and,
once the answer has gone out, takes the settled request's flat ``record`` (``finish``) and queues it for
the exporter, which writes each batch's spans (``encode``; the prompt and answer as JSON where
``telemetry.content`` lets them in) and posts them, from a task of its own."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.telemetry.collector import TraceExportCollector
from gateway.telemetry.context import ParentContext, new_span_id, new_trace_id, parse_traceparent, traceparent
from gateway.telemetry.encode import request_messages
from gateway.telemetry.exporter import SpanExporter
from gateway.telemetry.otlp import span_bytes
from gateway.telemetry.record import (
    NO_SPAN_IDS,
    DecisionRecord,
    RequestRecord,
    StreamedAnswer,
    decision_record,
    request_record,
)
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings
from gateway.telemetry.spans import attempt_span
from gateway.values.observation import Attempt, Observation
from gateway.version import gateway_version

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
    from gateway.policy.decide import Decision
    from gateway.policy.telemetry import Telemetry

# The fields a door's payload holds its prompt in: chat messages, a completion's prompt, Responses input.
PROMPT_FIELDS = ("messages", "prompt", "input")


class Tracer:
    def __init__(
        self, settings: TelemetrySettings, clock: Callable[[], float], wall_clock: Callable[[], float]
    ) -> None:
        self.settings = settings
        self.content = settings.content
        self._clock, self._wall_clock = clock, wall_clock
        self._sampler = settings.sampler
        self._keeps_every_new_trace = settings.sampler.ratio >= 1.0
        resource = {
            "service.name": settings.service_name,
            "service.version": gateway_version(),
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
            "telemetry.sdk.name": "llm-gateway",
            "telemetry.sdk.language": "python",
        }
        self.exporter: SpanExporter[Pending] = SpanExporter(settings, resource, span_messages, span_count)

    def begin(self, traceparent_header: str | None, tracestate_header: str | None) -> RequestTrace | None:
        """At arrival: the request's trace (the client's continued, else a new one), or None when it
        is not sampled and there is no client context to pass on."""
        if traceparent_header is None and self._keeps_every_new_trace:  # the usual request: no sampling
            offset = self._wall_clock() - self._clock()
            return RequestTrace(self, (new_trace_id(), new_span_id(), b"", "", offset), None)
        parent = parse_traceparent(traceparent_header, tracestate_header)
        trace_id = new_trace_id() if parent is None else parent.trace_id
        if not self._sampler.keeps(trace_id, parent):
            return None if parent is None else RequestTrace(self, None, parent)
        offset = self._wall_clock() - self._clock()
        if parent is None:
            return RequestTrace(self, (trace_id, new_span_id(), b"", "", offset), None)
        return RequestTrace(
            self, (trace_id, new_span_id(), parent.span_id, parent.trace_state, offset), parent
        )

    def probe(self, observation: Observation, backend: CompiledBackend) -> None:
        """A synthetic probe: a trace of its own, one client span."""
        if observation.attempts and self._sampler.keeps(new_trace_id(), None):
            self.exporter.put(
                PendingProbe(observation.attempts[0], backend, self._wall_clock() - self._clock())
            )

    async def close(self) -> None:
        await self.exporter.close()


class RequestTrace:
    """One request's trace context: ``ids`` when it is sampled (its spans will be exported: trace id,
    server span id, the client's span id or b"", tracestate, wall clock minus the gateway's clock at
    arrival), else only the client's context, passed on to the engines unchanged."""

    __slots__ = ("_tracer", "answer", "decision", "ids", "parent", "queued", "span_ids")

    def __init__(
        self, tracer: Tracer, ids: tuple[bytes, bytes, bytes, str, float] | None, parent: ParentContext | None
    ) -> None:
        self._tracer, self.ids, self.parent = tracer, ids, parent
        self.span_ids: dict[int, bytes] | None = None  # each attempt's span id, when sent upstream
        self.queued: list[tuple[float, float]] | None = None  # waits in the route's queue
        # What the answer was, kept only where the trace may hold it (``keeps_content``): a whole
        # answer's body, or the meter's transcript of a stream.
        self.answer: bytes | StreamedAnswer | None = None
        self.decision: DecisionRecord | None = None  # the route's decision, taken when it was made

    def decided(self, decision: Decision) -> None:
        """The decision's record, taken the moment it is made: its candidates' evaluations read the
        backends' standings and views the decision has just read. Taken when the request settled (on a
        gateway at 64 in flight, after other requests' work had gone by, out of the CPU's caches), it
        was 10 of the 17 us that ``finish`` took (medians in the gateway at saturation)."""
        if self.ids is not None:
            self.decision = decision_record(decision)

    def keeps_content(self, route: CompiledRoute) -> bool:
        """Whether this request's prompt and answer go into its spans (``telemetry.content``, never on
        a private route)."""
        return self.ids is not None and self._tracer.content and not route.private

    def headers(self, backend: CompiledBackend, attempt_index: int) -> bytes:
        """The ``traceparent``/``tracestate`` header lines of an attempt's call (``UpstreamCall``) to a
        backend that takes the trace context (``trace_context``: the self-hosted engines by default, never
        a paid API unless its policy says so); the attempt's span id is the parent the engine's spans
        name. b"": none."""
        if not backend.trace_context:
            return b""
        ids, parent = self.ids, self.parent
        if ids is not None:
            span_id = new_span_id()
            if self.span_ids is None:
                self.span_ids = {}
            self.span_ids[attempt_index] = span_id
            header, state = traceparent(ids[0], span_id, True), ids[3]
        else:
            assert parent is not None
            header, state = traceparent(parent.trace_id, parent.span_id, parent.sampled), parent.trace_state
        lines = f"traceparent: {header}\r\n" + (f"tracestate: {state}\r\n" if state else "")
        return lines.encode("latin-1")

    def waited(self, began: float, ended: float) -> None:
        """A wait in the route's queue, in the gateway's clock."""
        if self.ids is not None and ended > began:
            if self.queued is None:
                self.queued = []
            self.queued.append((began, ended))

    def finish(
        self,
        observation: Observation | None,
        decision: Decision | None,
        payload: dict[str, Any] | None,
        policy: CompiledPolicy,
    ) -> None:
        """The settled request's record, queued for the exporter (``record``: why a record)."""
        ids = self.ids
        if ids is None or observation is None:
            return
        route = policy.routes.get(observation.route) if self._tracer.content else None
        prompt = answer = None
        if route is not None and self.keeps_content(route):
            if payload is not None:
                prompt = next((payload[f] for f in PROMPT_FIELDS if f in payload), None)
            answer = self.answer
        record = request_record(
            ids,
            self.span_ids or NO_SPAN_IDS,
            self.queued or (),
            observation,
            self.decision if self.decision is not None else decision,
            policy.backends,
            prompt,
            answer,
        )
        # Queued as a record, its spans written as its batch is posted: one batch's records written in
        # one loop, with the writer's code and cached blocks hot, cost less of the gateway's CPU than
        # each request's written as it settled, between other requests' work (docs/performance.md,
        # "Tracing off and on").
        self._tracer.exporter.put(record)


class PendingProbe:
    """A probe's attempt, written as its own trace's one span (probes are few: the readable span model,
    ``spans``, writes it)."""

    __slots__ = ("attempt", "backend", "wall_offset_s")

    def __init__(self, attempt: Attempt, backend: CompiledBackend, wall_offset_s: float) -> None:
        self.attempt, self.backend, self.wall_offset_s = attempt, backend, wall_offset_s

    def span_messages(self) -> list[bytes]:
        offset = self.wall_offset_s
        span = attempt_span(
            new_trace_id(),
            new_span_id(),
            b"",
            self.attempt,
            self.backend,
            "chat",
            lambda clock_s: int((clock_s + offset) * 1e9),
        )
        span.name = f"probe {self.backend.name}"
        span.attributes["gateway.probe"] = True
        return [span_bytes(span)]


# What the request path queues for the exporter: what a settled request's or a probe's spans are written
# from as their batch is posted.
Pending = RequestRecord | PendingProbe


def span_messages(pending: Pending) -> list[bytes]:
    """As a batch is posted: the spans of a settled request or a probe, as OTLP ``Span`` messages."""
    return request_messages(pending) if isinstance(pending, tuple) else pending.span_messages()


def span_count(pending: Pending) -> int:
    return 1 + len(pending[22]) + len(pending[23]) if isinstance(pending, tuple) else 1


def start_tracing(
    policy: Telemetry,
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    registry: CollectorRegistry,
) -> Tracer | None:
    """The runtime's tracer from the policy and the ``OTEL_*`` environment, its exporter's counts in the
    metrics; None (tracing off) when no endpoint is named."""
    settings = telemetry_settings(policy, os.environ)
    if settings is None:
        return None
    tracer = Tracer(settings, clock, wall_clock)
    registry.register(TraceExportCollector(tracer.exporter))
    return tracer
