"""The tracer the runtime holds when tracing is on, and the ``RequestTrace`` each request carries.

On the request path it does three small things: reads the client's traceparent and samples at arrival
(``begin``), hands each attempt's call its traceparent (``upstream``, for backends that take one) and
queues the settled request (``finish``). Spans are written later, in the exporter's thread (``encode``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from gateway.backends.base import UpstreamCall
from gateway.telemetry.collector import TraceExportCollector
from gateway.telemetry.context import ParentContext, new_span_id, new_trace_id, parse_traceparent, traceparent
from gateway.telemetry.encode import attempt_span_message, request_span_messages
from gateway.telemetry.exporter import SpanExporter
from gateway.telemetry.settings import TelemetrySettings, telemetry_settings
from gateway.telemetry.spans import TraceIds
from gateway.values.observation import Attempt, Observation
from gateway.version import gateway_version

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.policy.compiled import CompiledBackend, CompiledPolicy
    from gateway.policy.decide import Decision
    from gateway.policy.telemetry import Telemetry

# The fields a door's payload holds its prompt in: chat messages, a completion's prompt, Responses input.
PROMPT_FIELDS = ("messages", "prompt", "input")


class Tracer:
    def __init__(
        self, settings: TelemetrySettings, clock: Callable[[], float], wall_clock: Callable[[], float]
    ) -> None:
        self.settings = settings
        self._clock, self._wall_clock = clock, wall_clock
        self._sampler = settings.sampler
        resource = {
            "service.name": settings.service_name,
            "service.version": gateway_version(),
            "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
            "telemetry.sdk.name": "llm-gateway",
            "telemetry.sdk.language": "python",
        }
        self.exporter = SpanExporter(settings, resource)

    def begin(self, traceparent_header: str | None, tracestate_header: str | None) -> RequestTrace | None:
        """At arrival: the request's trace (the client's continued, else a new one), or None when it
        is not sampled and there is no client context to pass on."""
        parent = parse_traceparent(traceparent_header, tracestate_header)
        trace_id = new_trace_id() if parent is None else parent.trace_id
        if not self._sampler.keeps(trace_id, parent):
            return None if parent is None else RequestTrace(self, None, parent)
        ids = TraceIds(
            trace_id,
            new_span_id(),
            b"" if parent is None else parent.span_id,
            "" if parent is None else parent.trace_state,
            self._wall_clock() - self._clock(),
        )
        return RequestTrace(self, ids, parent)

    def finished(
        self,
        ids: TraceIds,
        observation: Observation,
        decision: Decision | None,
        payload: dict[str, Any] | None,
        policy: CompiledPolicy,
    ) -> None:
        route = policy.routes.get(observation.route)
        content = self.settings.content and route is not None and not route.private
        self.exporter.put(
            PendingRequest(ids, observation, decision, policy.backends, payload if content else None)
        )

    def probe(self, observation: Observation, backend: CompiledBackend) -> None:
        """A synthetic probe: a trace of its own, one client span."""
        if observation.attempts and self._sampler.keeps(new_trace_id(), None):
            self.exporter.put(
                PendingProbe(observation.attempts[0], backend, self._wall_clock() - self._clock())
            )

    def close(self) -> None:
        self.exporter.close()


class RequestTrace:
    """One request's trace context: ``ids`` when it is sampled (its spans will be exported), else only
    the client's context, passed on to the engines unchanged."""

    __slots__ = ("_tracer", "ids", "parent")

    def __init__(self, tracer: Tracer, ids: TraceIds | None, parent: ParentContext | None) -> None:
        self._tracer, self.ids, self.parent = tracer, ids, parent

    def upstream(self, call: UpstreamCall, attempt_index: int) -> UpstreamCall:
        """The call with ``traceparent``/``tracestate`` headers for a backend that takes the trace
        context (``trace_context``: the self-hosted engines by default, never a paid API unless its
        policy says so); the attempt's span id is the parent the engine's spans name."""
        if not call.backend.trace_context:
            return call
        ids, parent = self.ids, self.parent
        if ids is not None:
            span_id = ids.attempt_span_ids[attempt_index] = new_span_id()
            header, state = traceparent(ids.trace_id, span_id, True), ids.trace_state
        else:
            assert parent is not None
            header, state = traceparent(parent.trace_id, parent.span_id, parent.sampled), parent.trace_state
        lines = f"traceparent: {header}\r\n" + (f"tracestate: {state}\r\n" if state else "")
        # Built field by field: dataclasses.replace was a quarter of tracing's request-path cost.
        return UpstreamCall(
            call.backend, call.path, call.body, call.stream, call.wait_s, lines.encode("latin-1")
        )

    def waited(self, began: float, ended: float) -> None:
        """A wait in the route's queue, in the gateway's clock."""
        if self.ids is not None and ended > began:
            self.ids.queued.append((began, ended))

    def finish(
        self,
        observation: Observation | None,
        decision: Decision | None,
        payload: dict[str, Any] | None,
        policy: CompiledPolicy,
    ) -> None:
        if self.ids is not None and observation is not None:
            self._tracer.finished(self.ids, observation, decision, payload, policy)


class PendingRequest:
    __slots__ = ("backends", "decision", "ids", "observation", "payload")

    def __init__(
        self,
        ids: TraceIds,
        observation: Observation,
        decision: Decision | None,
        backends: Mapping[str, CompiledBackend],
        payload: dict[str, Any] | None,
    ) -> None:
        self.ids, self.observation, self.decision = ids, observation, decision
        self.backends, self.payload = backends, payload

    def span_count(self) -> int:
        return 1 + len(self.observation.attempts) + len(self.ids.queued)

    def span_messages(self) -> list[bytes]:
        messages = None
        if self.payload is not None:
            prompt = next((self.payload[f] for f in PROMPT_FIELDS if f in self.payload), None)
            messages = None if prompt is None else orjson.dumps(prompt).decode()
        return request_span_messages(self.ids, self.observation, self.decision, self.backends, messages)


class PendingProbe:
    __slots__ = ("attempt", "backend", "wall_offset_s")

    def __init__(self, attempt: Attempt, backend: CompiledBackend, wall_offset_s: float) -> None:
        self.attempt, self.backend, self.wall_offset_s = attempt, backend, wall_offset_s

    def span_count(self) -> int:
        return 1

    def span_messages(self) -> list[bytes]:
        offset = self.wall_offset_s
        message = attempt_span_message(
            new_trace_id(),
            new_span_id(),
            b"",
            self.attempt,
            self.backend,
            "chat",
            lambda clock_s: int((clock_s + offset) * 1e9),
            PROBE_ATTRIBUTES,
            f"probe {self.backend.name}",
        )
        return [message]


PROBE_ATTRIBUTES = {"gateway.probe": True}


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
