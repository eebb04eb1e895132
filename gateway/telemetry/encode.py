"""A settled request written straight to OTLP ``Span`` messages: the server span, the route's queue, one
client span per attempt, the decision as events, with no span objects in between.

The spans and their attributes are those ``spans`` describes (GenAI semantic conventions, ``gateway.*``
where none exists); this writes them for the exporter's thread at the cost the 10% budget of issue 37
allows. Why it is fast: protobuf lets a message's fields come in any order, so everything in a span that
repeats from request to request (its name, kind, and the text and flag attributes fixed by the route,
backend, status and decision: about two thirds of its bytes) is one cached block of bytes, looked up by
the values it was written from; only ids, times and numbers are written per request. The caches are
bounded, whatever names and values a policy or its clients bring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.telemetry.context import new_span_id
from gateway.telemetry.otlp import (
    SAMPLED_FLAGS,
    attributes,
    error_status,
    fixed64,
    kv_double,
    kv_int,
    len_field,
    span_ids,
    span_times,
    text_field,
    varint,
)
from gateway.telemetry.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    OPERATIONS,
    PROVIDERS,
    AttributeValue,
    TraceIds,
    server_address,
)
from gateway.values.observation import Attempt, Observation, Usage

if TYPE_CHECKING:
    from gateway.policy.compiled import CompiledBackend
    from gateway.policy.decide import Decision


MAX_CACHED = 4096
_fixed: dict[tuple[object, ...], bytes] = {}


def _cached(key: tuple[object, ...], make: Callable[[], bytes]) -> bytes:
    block = _fixed.get(key)
    if block is None:
        block = make()
        if len(_fixed) < MAX_CACHED:
            _fixed[key] = block
    return block


def _usage(attempts: Sequence[Attempt]) -> bytes:
    if len(attempts) == 1:
        usage = attempts[0].usage
        if usage is None:
            return b""
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        cached, reasoning, counted = (
            usage.cached_prompt_tokens,
            usage.reasoning_tokens,
            usage.source == "counted",
        )
    else:
        found: list[Usage] = [a.usage for a in attempts if a.usage is not None]
        if not found:
            return b""
        prompt = sum(u.prompt_tokens for u in found)
        completion = sum(u.completion_tokens for u in found)
        cached = sum(u.cached_prompt_tokens for u in found)
        reasoning = sum(u.reasoning_tokens for u in found)
        counted = any(u.source == "counted" for u in found)
    return b"".join(
        (
            kv_int(9, "gen_ai.usage.input_tokens", prompt),
            kv_int(9, "gen_ai.usage.output_tokens", completion),
            kv_int(9, "gen_ai.usage.cache_read.input_tokens", cached),
            kv_int(9, "gen_ai.usage.reasoning.output_tokens", reasoning),
            _SOURCES[counted],
        )
    )


_SOURCES = {
    flag: attributes(9, {"gateway.usage_source": "counted" if flag else "reported"}) for flag in (False, True)
}


def request_span_messages(
    ids: TraceIds,
    observation: Observation,
    decision: Decision | None,
    backends: Mapping[str, CompiledBackend],
    input_messages: str | None,
    output_messages: str | None = None,
) -> list[bytes]:
    """One settled request's ``Span`` messages; the messages: the prompt and the answer as JSON, when
    the policy lets them in."""
    end = observation.finished_at if observation.finished_at is not None else observation.started_at
    operation = OPERATIONS.get(observation.endpoint, observation.endpoint)
    final = observation.final
    final_backend = final.backend if final is not None else None
    error = None if observation.status == "ok" else (observation.error_type or observation.status)
    final_model = None
    if final_backend is not None and (compiled := backends.get(final_backend)) is not None:
        final_model = compiled.model

    def server_block() -> bytes:
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": observation.route,
            "gen_ai.request.stream": observation.stream,
            "gateway.route": observation.route,
            "gateway.status": observation.status,
        }
        for name, value in (
            ("gateway.cost_basis", observation.cost_basis),
            ("gateway.decision.reason", observation.decision_reason),
            ("gateway.api_key", observation.api_key_name),
        ):
            if value is not None:
                attrs[name] = value
        if final_backend is not None:
            attrs["gateway.backend"] = final_backend
        if final_model is not None:
            attrs["gen_ai.response.model"] = final_model
        if error is not None:
            attrs["error.type"] = error
        block = text_field(5, f"{operation} {observation.route}") + b"\x30" + varint(KIND_SERVER)
        block += attributes(9, attrs)
        return block + (error_status(error) if error is not None else b"") + SAMPLED_FLAGS

    fixed = _cached(
        (
            "server",
            operation,
            observation.route,
            observation.stream,
            observation.status,
            observation.cost_basis,
            observation.decision_reason,
            observation.api_key_name,
            final_backend,
            error,
            final_model,
        ),
        server_block,
    )
    ns = ids.ns
    out = [
        span_ids(ids.trace_id, ids.server_span_id, ids.parent_span_id),
        span_times(ns(observation.started_at), ns(end)),
        fixed,
        attributes(9, {"gateway.request_id": observation.request_id}),
        kv_int(9, "gateway.attempts", len(observation.attempts)),
        kv_double(9, "gateway.cost_usd", observation.cost_usd or 0.0),
        kv_double(9, "gateway.queued_s", observation.queued_s),
        _usage(observation.attempts),
    ]
    if ids.trace_state:
        out.append(text_field(3, ids.trace_state))
    if observation.max_tokens is not None:
        out.append(kv_int(9, "gen_ai.request.max_tokens", observation.max_tokens))
    if observation.predicted_cached_tokens is not None:
        out.append(kv_int(9, "gateway.expected_cached_tokens", observation.predicted_cached_tokens))
    content: dict[str, AttributeValue] = {}
    if input_messages is not None:
        content["gen_ai.input.messages"] = input_messages
    if output_messages is not None:
        content["gen_ai.output.messages"] = output_messages
    if content:
        out.append(attributes(9, content))
    if decision is not None:
        first = observation.attempts[0].started_at if observation.attempts else end
        out.append(decision_events(decision, ns(first)))
    messages = [b"".join(out)]
    for began, ended in ids.queued:
        queue = span_ids(ids.trace_id, new_span_id(), ids.server_span_id) + span_times(ns(began), ns(ended))
        messages.append(
            queue + _cached(("queue", observation.route), lambda: _queue_block(observation.route))
        )
    previous: bytes | None = None
    for index, attempt in enumerate(observation.attempts):
        span_id = ids.attempt_span_ids.get(index) or new_span_id()
        body = attempt_span_message(
            ids.trace_id, span_id, ids.server_span_id, attempt, backends.get(attempt.backend), operation, ns
        )
        body += kv_int(9, "gateway.attempt", index + 1)
        if attempt.resumed is not None and previous is not None:  # a takeover: linked to the cut attempt
            # Link 13 {trace_id 1, span_id 2, attributes 4, flags 6}
            link = b"\x0a\x10" + ids.trace_id + b"\x12\x08" + previous + _RESUMES_LINK
            body += len_field(13, link)
            # Also as an attribute: some stores (Phoenix) keep no links.
            body += attributes(9, {"gateway.resumes_span_id": previous.hex()})
        messages.append(body)
        previous = span_id
    return messages


_RESUMES_LINK = attributes(4, {"gateway.link": "resumes"}) + b"\x35\x01\x00\x00\x00"


def _queue_block(route: str) -> bytes:
    block = text_field(5, "gateway.queue") + b"\x30" + varint(KIND_INTERNAL)
    return block + attributes(9, {"gateway.route": route}) + SAMPLED_FLAGS


def attempt_span_message(
    trace_id: bytes,
    span_id: bytes,
    parent: bytes,
    attempt: Attempt,
    backend: CompiledBackend | None,
    operation: str,
    ns: Callable[[float], int],
    extra: Mapping[str, AttributeValue] | None = None,
    name: str | None = None,
) -> bytes:
    """One attempt's client span (a probe's too: its ``name`` and ``extra`` attributes)."""
    end = attempt.finished_at if attempt.finished_at is not None else attempt.started_at
    error = None if attempt.status == "ok" else (attempt.error or attempt.status)

    def attempt_block() -> bytes:
        model = backend.model if backend is not None else attempt.backend
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gateway.backend": attempt.backend,
            "gateway.attempt.status": attempt.status,
        }
        if backend is not None:
            attrs["gen_ai.provider.name"] = PROVIDERS.get(backend.dialect, backend.dialect)
            attrs["gateway.dialect"] = backend.dialect
            attrs.update(server_address(backend.base_url))
        for key, value in (
            ("http.response.status_code", attempt.http_status),
            ("gateway.cost_basis", attempt.cost_basis),
            ("gateway.resumed", attempt.resumed),
        ):
            if value is not None:
                attrs[key] = value
        if attempt.status != "ok":
            attrs["error.type"] = attempt.status
        attrs.update(extra or {})
        block = text_field(5, name or f"{operation} {model}") + b"\x30" + varint(KIND_CLIENT)
        block += attributes(9, attrs)
        return block + SAMPLED_FLAGS

    fixed = _cached(
        (
            "attempt",
            attempt.backend,
            None if backend is None else (backend.model, backend.dialect, backend.base_url),
            operation,
            attempt.status,
            attempt.http_status,
            attempt.cost_basis,
            attempt.resumed,
            name,
            None if extra is None else tuple(extra.items()),
        ),
        attempt_block,
    )
    out = [span_ids(trace_id, span_id, parent), span_times(ns(attempt.started_at), ns(end)), fixed]
    if error is not None:  # its message is free text (an upstream's words): written, never cached
        out.append(error_status(error))
    if attempt.ttft_s is not None:
        out.append(kv_double(9, "gen_ai.response.time_to_first_chunk", attempt.ttft_s))
    if attempt.first_answer_s is not None:
        out.append(kv_double(9, "gateway.first_answer_s", attempt.first_answer_s))
    if attempt.cost_usd is not None:
        out.append(kv_double(9, "gateway.cost_usd", attempt.cost_usd))
    out.append(_usage((attempt,)))
    return b"".join(out)


def decision_events(decision: Decision, time_ns: int) -> bytes:
    """The decision (its order and reason) and one event per candidate it weighed: predicted TTFT p95,
    expected $ and the cached prompt tokens it counted on, or why it was left out. Event 11 {time 1,
    name 2, attributes 3}."""
    when = b"\x09" + fixed64(time_ns)
    head = _cached(
        ("decision", decision.reason, decision.order),
        lambda: (
            text_field(2, "gateway.decision")
            + attributes(
                3,
                {"gateway.decision.reason": decision.reason, "gateway.decision.order": list(decision.order)},
            )
        ),
    )
    out = [
        len_field(
            11,
            when
            + head
            + kv_double(3, "gateway.decision.expected_cost_usd", decision.expected_cost_usd or 0.0),
        )
    ]
    for candidate in decision.evals:
        key = ("candidate", candidate.backend, candidate.eligible, candidate.feasible, candidate.blocked_by)
        head = _fixed.get(key) or _candidate_head(key)
        body = [
            when,
            head,
            kv_int(
                3,
                "gateway.candidate.expected_cached_tokens",
                decision.cached_tokens.get(candidate.backend, 0),
            ),
        ]
        if candidate.ttft_p95_s is not None:
            body.append(kv_double(3, "gateway.candidate.predicted_ttft_p95_s", candidate.ttft_p95_s))
        if candidate.expected_cost_usd is not None:
            body.append(kv_double(3, "gateway.candidate.expected_cost_usd", candidate.expected_cost_usd))
        out.append(len_field(11, b"".join(body)))
    return b"".join(out)


def _candidate_head(key: tuple[object, ...]) -> bytes:
    _, backend, eligible, feasible, blocked_by = key
    return _cached(
        key,
        lambda: (
            text_field(2, "gateway.candidate") + _candidate_flags(backend, eligible, feasible, blocked_by)
        ),
    )


def _candidate_flags(backend: object, eligible: object, feasible: object, blocked_by: object) -> bytes:
    assert isinstance(backend, str) and isinstance(eligible, bool) and isinstance(feasible, bool)
    attrs: dict[str, AttributeValue] = {
        "gateway.backend": backend,
        "gateway.candidate.eligible": eligible,
        "gateway.candidate.feasible": feasible,
    }
    if blocked_by:
        assert isinstance(blocked_by, tuple)
        attrs["gateway.candidate.blocked_by"] = [str(b) for b in blocked_by]
    return attributes(3, attrs)
