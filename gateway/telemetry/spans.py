"""A settled request as spans: the server span, the route's queue, one client span per attempt, the
decision as events, as objects: the model the exporter's writer (``encode``) follows, and what probes'
and tests' spans are read against. Never built on the request path.

Names follow the OpenTelemetry GenAI semantic conventions (docs/registry/attributes/gen-ai.md of
open-telemetry/semantic-conventions, now kept in semantic-conventions-genai) where they exist:
``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``/``max_tokens``/``stream``,
``gen_ai.response.model``, ``gen_ai.usage.input_tokens``/``output_tokens``/
``cache_read.input_tokens``/``reasoning.output_tokens``, ``gen_ai.response.time_to_first_chunk``,
``gen_ai.input.messages``/``output.messages``; ``server.address``/``server.port``, ``error.type``,
``http.response.status_code`` from the general ones; ``gateway.*`` for what only a gateway knows
(route, decision, cost, queue, resume).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.telemetry.context import new_span_id
from gateway.values.observation import Attempt, Observation

if TYPE_CHECKING:
    from gateway.policy.compiled import CompiledBackend
    from gateway.policy.decide import Decision

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[float]
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3
OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings", "probe": "chat"}
# gen_ai.provider.name: the well-known value where one applies (a paid OpenAI-compatible API says openai),
# else the engine's name.
PROVIDERS = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llama.cpp",
    "openai": "openai",
    "litellm": "litellm",
}


@dataclass(slots=True)
class Event:
    name: str
    time_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(slots=True)
class Link:
    trace_id: bytes
    span_id: bytes
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    error: str | None = None  # the status message of a span that failed; None: unset
    trace_state: str = ""


@dataclass(slots=True)
class TraceIds:
    """What a request's trace was given on its way: ids, the client's parent, what went upstream."""

    trace_id: bytes
    server_span_id: bytes
    parent_span_id: bytes  # the client's span; b"": a trace the gateway began
    trace_state: str
    wall_offset_s: float  # wall clock minus the gateway's clock, taken at arrival
    attempt_span_ids: dict[int, bytes] = field(default_factory=dict)  # those sent upstream, by attempt
    queued: list[tuple[float, float]] = field(default_factory=list)  # waits in the route's queue

    def ns(self, clock_s: float) -> int:
        return int((clock_s + self.wall_offset_s) * 1e9)


def request_spans(
    ids: TraceIds,
    observation: Observation,
    decision: Decision | None,
    backends: Mapping[str, CompiledBackend],
    messages: str | None,
    output_messages: str | None = None,
) -> list[Span]:
    """The spans of one settled request; ``messages`` and ``output_messages``: the prompt and the answer
    as JSON, when the policy lets them in.

    The readable form of what the exporter writes: ``encode`` writes the same spans as bytes without
    building these objects (tests/unit/test_telemetry_encode.py holds the two to each other)."""
    end = observation.finished_at if observation.finished_at is not None else observation.started_at
    operation = OPERATIONS.get(observation.endpoint, observation.endpoint)
    server = Span(
        ids.trace_id,
        ids.server_span_id,
        ids.parent_span_id,
        f"{operation} {observation.route}",
        KIND_SERVER,
        ids.ns(observation.started_at),
        ids.ns(end),
        trace_state=ids.trace_state,
    )
    final = observation.final
    attrs = server.attributes
    attrs.update(
        {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": observation.route,
            "gen_ai.request.stream": observation.stream,
            "gateway.request_id": observation.request_id,
            "gateway.route": observation.route,
            "gateway.status": observation.status,
            "gateway.attempts": len(observation.attempts),
            "gateway.cost_usd": observation.cost_usd or 0.0,
            "gateway.queued_s": observation.queued_s,
        }
    )
    _optional(attrs, "gen_ai.request.max_tokens", observation.max_tokens)
    _optional(attrs, "gateway.cost_basis", observation.cost_basis)
    _optional(attrs, "gateway.decision.reason", observation.decision_reason)
    _optional(attrs, "gateway.api_key", observation.api_key_name)
    _optional(attrs, "gateway.expected_cached_tokens", observation.predicted_cached_tokens)
    _usage(attrs, observation.attempts)
    if final is not None:
        attrs["gateway.backend"] = final.backend
        backend = backends.get(final.backend)
        if backend is not None:
            attrs["gen_ai.response.model"] = backend.model
    if messages is not None:
        attrs["gen_ai.input.messages"] = messages
    if output_messages is not None:
        attrs["gen_ai.output.messages"] = output_messages
    if observation.status != "ok":
        server.error = observation.error_type or observation.status
        attrs["error.type"] = server.error
    spans = [server]
    if decision is not None:
        first = observation.attempts[0].started_at if observation.attempts else end
        server.events += decision_events(decision, ids.ns(first))
    for began, ended in ids.queued:
        queue = Span(
            ids.trace_id,
            new_span_id(),
            ids.server_span_id,
            "gateway.queue",
            KIND_INTERNAL,
            ids.ns(began),
            ids.ns(ended),
        )
        queue.attributes["gateway.route"] = observation.route
        spans.append(queue)
    previous: Span | None = None
    for index, attempt in enumerate(observation.attempts):
        span_id = ids.attempt_span_ids.get(index) or new_span_id()
        span = attempt_span(
            ids.trace_id,
            span_id,
            ids.server_span_id,
            attempt,
            backends.get(attempt.backend),
            operation,
            ids.ns,
        )
        span.attributes["gateway.attempt"] = index + 1
        if attempt.resumed is not None and previous is not None:  # a takeover: linked to the cut attempt
            span.links.append(Link(ids.trace_id, previous.span_id, {"gateway.link": "resumes"}))
            # Also as an attribute: some stores (Phoenix) keep no links.
            span.attributes["gateway.resumes_span_id"] = previous.span_id.hex()
        spans.append(span)
        previous = span
    return spans


def attempt_span(
    trace_id: bytes,
    span_id: bytes,
    parent: bytes,
    attempt: Attempt,
    backend: CompiledBackend | None,
    operation: str,
    ns: Callable[[float], int],
) -> Span:
    model = backend.model if backend is not None else attempt.backend
    end = attempt.finished_at if attempt.finished_at is not None else attempt.started_at
    span = Span(
        trace_id, span_id, parent, f"{operation} {model}", KIND_CLIENT, ns(attempt.started_at), ns(end)
    )
    attrs = span.attributes
    attrs.update(
        {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gateway.backend": attempt.backend,
            "gateway.attempt.status": attempt.status,
        }
    )
    if backend is not None:
        attrs["gen_ai.provider.name"] = PROVIDERS.get(backend.dialect, backend.dialect)
        attrs["gateway.dialect"] = backend.dialect
        attrs.update(server_address(backend.base_url))
    _optional(attrs, "gen_ai.response.time_to_first_chunk", attempt.ttft_s)
    _optional(attrs, "gateway.first_answer_s", attempt.first_answer_s)
    _optional(attrs, "http.response.status_code", attempt.http_status)
    _optional(attrs, "gateway.cost_usd", attempt.cost_usd)
    _optional(attrs, "gateway.cost_basis", attempt.cost_basis)
    _optional(attrs, "gateway.resumed", attempt.resumed)
    _usage(attrs, (attempt,))
    if attempt.status != "ok":
        span.error = attempt.error or attempt.status
        attrs["error.type"] = attempt.status
    return span


@functools.lru_cache(maxsize=1024)
def server_address(base_url: str) -> dict[str, AttributeValue]:
    """``server.address`` and ``server.port`` of a backend's URL (read once per URL)."""
    url = urlsplit(base_url)
    found: dict[str, AttributeValue] = {}
    if url.hostname:
        found["server.address"] = url.hostname
    if url.port:
        found["server.port"] = url.port
    return found


def decision_events(decision: Decision, time_ns: int) -> list[Event]:
    """The decision (its order and reason) and one event per candidate it weighed: predicted TTFT p95,
    expected $ and the cached prompt tokens it counted on, or why it was left out."""
    events = [
        Event(
            "gateway.decision",
            time_ns,
            {
                "gateway.decision.reason": decision.reason,
                "gateway.decision.order": list(decision.order),
                "gateway.decision.expected_cost_usd": decision.expected_cost_usd or 0.0,
            },
        )
    ]
    for candidate in decision.evals:
        attrs: dict[str, AttributeValue] = {
            "gateway.backend": candidate.backend,
            "gateway.candidate.eligible": candidate.eligible,
            "gateway.candidate.feasible": candidate.feasible,
            "gateway.candidate.expected_cached_tokens": decision.cached_tokens.get(candidate.backend, 0),
        }
        _optional(attrs, "gateway.candidate.predicted_ttft_p95_s", candidate.ttft_p95_s)
        _optional(attrs, "gateway.candidate.expected_cost_usd", candidate.expected_cost_usd)
        if candidate.blocked_by:
            attrs["gateway.candidate.blocked_by"] = list(candidate.blocked_by)
        events.append(Event("gateway.candidate", time_ns, attrs))
    return events


def _usage(attrs: dict[str, AttributeValue], attempts: Sequence[Attempt]) -> None:
    prompt = completion = cached = reasoning = 0
    counted = found = False
    for attempt in attempts:  # one pass: this runs for every span of every traced request
        usage = attempt.usage
        if usage is not None:
            found = True
            prompt += usage.prompt_tokens
            completion += usage.completion_tokens
            cached += usage.cached_prompt_tokens
            reasoning += usage.reasoning_tokens
            counted = counted or usage.source == "counted"
    if found:
        attrs["gen_ai.usage.input_tokens"] = prompt
        attrs["gen_ai.usage.output_tokens"] = completion
        attrs["gen_ai.usage.cache_read.input_tokens"] = cached
        attrs["gen_ai.usage.reasoning.output_tokens"] = reasoning
        attrs["gateway.usage_source"] = "counted" if counted else "reported"


def _optional(attrs: dict[str, AttributeValue], name: str, value: AttributeValue | None) -> None:
    if value is not None:
        attrs[name] = value
