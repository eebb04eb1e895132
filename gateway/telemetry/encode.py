"""A settled request's record (``record``) written straight to OTLP ``Span`` messages: the server span,
the route's queue, one client span per attempt, the decision as events, with no span objects in between.

The spans and their attributes are those ``spans`` describes (GenAI semantic conventions, ``gateway.*``
where none exists); the exporter writes them as it posts each batch, on the event loop, at the cost the
10% budget of issue 37 allows.
Why it is fast: protobuf lets a message's fields come in any order, so everything in a span that
repeats from request to request (its name, kind, and the text and flag attributes fixed by the route,
backend, status and decision: about two thirds of its bytes) is one cached block of bytes, looked up by
the slice of the record it was written from; only ids, times and numbers are written per request, each
number behind a head (field tag, lengths, key) written once per attribute name. The caches are bounded,
whatever names and values a policy or its clients bring.
"""

from __future__ import annotations

import struct
from typing import Final

from gateway.telemetry.content import output_messages
from gateway.telemetry.context import new_span_id
from gateway.telemetry.otlp import SAMPLED_FLAGS, attributes, error_status, len_field, text_field, varint
from gateway.telemetry.record import AttemptRecord, DecisionRecord, RequestRecord, UsageRecord
from gateway.telemetry.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    PROVIDERS,
    AttributeValue,
    server_address,
)

MAX_CACHED: Final = 4096
_fixed: Final[dict[object, bytes]] = {}
_SMALL: Final = [bytes((n,)) for n in range(0x80)]
# start_time_unix_nano 7 and end_time_unix_nano 8 (fixed64), tags and values in one call
_times: Final = struct.Struct("<BQBQ").pack
_double: Final = struct.Struct("<d").pack
_fixed64: Final = struct.Struct("<Q").pack


def _kept(key: object, block: bytes) -> bytes:
    """A block just written after a miss in ``_fixed``, kept there while it has room. Callers write it
    only on a miss (``_fixed.get(key) or _kept(key, ...)``), with no closure: a lambda made mypyc build
    an environment object on every call of the function that held it, hit or miss."""
    if len(_fixed) < MAX_CACHED:
        _fixed[key] = block
    return block


def _int_heads(field: int, name: str) -> list[bytes]:
    """KeyValue {key 1, value 2: AnyValue {int_value 3}} up to its varint, by the varint's size (1-10):
    the field tag, the KeyValue's length, the key, AnyValue's tag and length, int_value's tag."""
    key = text_field(1, name)
    assert len(key) < 100, name  # a KeyValue of a number then stays under 128 bytes: a one-byte length
    return [b""] + [
        varint(field << 3 | 2) + bytes((len(key) + 3 + size,)) + key + b"\x12" + bytes((size + 1,)) + b"\x18"
        for size in range(1, 11)
    ]


def _double_head(field: int, name: str) -> bytes:
    """KeyValue {key 1, value 2: AnyValue {double_value 4}} up to its 8 bytes."""
    key = text_field(1, name)
    assert len(key) < 100, name
    return varint(field << 3 | 2) + bytes((len(key) + 11,)) + key + b"\x12\x09\x21"


def _int(heads: list[bytes], value: int) -> bytes:
    if 0 <= value < 0x80:
        return heads[1] + _SMALL[value]
    encoded = varint(value)
    return heads[len(encoded)] + encoded


_INPUT: Final = _int_heads(9, "gen_ai.usage.input_tokens")
_OUTPUT: Final = _int_heads(9, "gen_ai.usage.output_tokens")
_CACHE_READ: Final = _int_heads(9, "gen_ai.usage.cache_read.input_tokens")
_REASONING: Final = _int_heads(9, "gen_ai.usage.reasoning.output_tokens")
_ATTEMPTS: Final = _int_heads(9, "gateway.attempts")
_ATTEMPT: Final = _int_heads(9, "gateway.attempt")
_MAX_TOKENS: Final = _int_heads(9, "gen_ai.request.max_tokens")
_EXPECTED_CACHED: Final = _int_heads(9, "gateway.expected_cached_tokens")
_CANDIDATE_CACHED: Final = _int_heads(3, "gateway.candidate.expected_cached_tokens")
_COST: Final = _double_head(9, "gateway.cost_usd")
_QUEUED: Final = _double_head(9, "gateway.queued_s")
_TTFT: Final = _double_head(9, "gen_ai.response.time_to_first_chunk")
_FIRST_ANSWER: Final = _double_head(9, "gateway.first_answer_s")
_DECISION_COST: Final = _double_head(3, "gateway.decision.expected_cost_usd")
_CANDIDATE_TTFT: Final = _double_head(3, "gateway.candidate.predicted_ttft_p95_s")
_CANDIDATE_COST: Final = _double_head(3, "gateway.candidate.expected_cost_usd")
_REQUEST_ID: Final = text_field(1, "gateway.request_id")
_SOURCES: Final = {
    flag: attributes(9, {"gateway.usage_source": "counted" if flag else "reported"}) for flag in (False, True)
}
_RESUMES_LINK: Final = attributes(4, {"gateway.link": "resumes"}) + b"\x35\x01\x00\x00\x00"


def _usage(usage: UsageRecord) -> bytes:
    prompt, completion, cached, reasoning, counted = usage
    return b"".join(
        (
            _int(_INPUT, prompt),
            _int(_OUTPUT, completion),
            _int(_CACHE_READ, cached),
            _int(_REASONING, reasoning),
            _SOURCES[counted],
        )
    )


def _summed(attempts: tuple[AttemptRecord, ...]) -> UsageRecord | None:
    found = [a[16] for a in attempts if a[16] is not None]
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    return (
        sum(u[0] for u in found),
        sum(u[1] for u in found),
        sum(u[2] for u in found),
        sum(u[3] for u in found),
        any(u[4] for u in found),
    )


def _ids(trace_id: bytes, span_id: bytes, parent: bytes) -> bytes:
    # trace_id 1, span_id 2, parent_span_id 4
    if parent:
        return b"\x0a\x10" + trace_id + b"\x12\x08" + span_id + b"\x22\x08" + parent
    return b"\x0a\x10" + trace_id + b"\x12\x08" + span_id


def _ns(clock_s: float, offset_s: float) -> int:
    value = int((clock_s + offset_s) * 1e9)
    return value if value > 0 else 0


def request_messages(record: RequestRecord) -> list[bytes]:
    """One settled request's ``Span`` messages."""
    # Fields read by index, never by slice: mypyc holds a record as a C struct, and a slice of one
    # boxes all 27 fields into a new tuple (its floats into new float objects) before slicing it.
    trace_id, server_id, parent, trace_state, offset = record[0], record[1], record[2], record[3], record[4]
    operation, route, status = record[5], record[6], record[8]
    request_id, started, ended, max_tokens = record[15], record[16], record[17], record[18]
    cost, queued_s, expected_cached = record[19], record[20], record[21]
    attempts, queued, decision, prompt, answer = record[22], record[23], record[24], record[25], record[26]
    r = record
    key = (operation, route, r[7], status, r[9], r[10], r[11], r[12], r[13], r[14])  # its block's key
    start_ns, end_ns = _ns(started, offset), _ns(ended, offset)
    request_id_bytes = request_id.encode("utf-8", "replace")
    out = [
        _ids(trace_id, server_id, parent),
        _times(0x39, start_ns, 0x41, end_ns if end_ns > start_ns else start_ns),
        _fixed.get(key) or _kept(key, _server_block(record)),
        # the request id: text, never a repeat, so never cached
        len_field(9, _REQUEST_ID + len_field(2, len_field(1, request_id_bytes))),
        _int(_ATTEMPTS, len(attempts)),
        _COST + _double(cost),
        _QUEUED + _double(queued_s),
    ]
    single = len(attempts) == 1
    usage = attempts[0][16] if single else _summed(attempts)
    usage_bytes = b"" if usage is None else _usage(usage)
    out.append(usage_bytes)
    if trace_state:
        out.append(text_field(3, trace_state))
    if max_tokens is not None:
        out.append(_int(_MAX_TOKENS, max_tokens))
    if expected_cached is not None:
        out.append(_int(_EXPECTED_CACHED, expected_cached))
    content: dict[str, AttributeValue] = {}
    if prompt is not None:
        content["gen_ai.input.messages"] = prompt
    if answer is not None and (said := output_messages(answer, operation, status == "ok")) is not None:
        content["gen_ai.output.messages"] = said
    if content:
        out.append(attributes(9, content))
    if decision is not None:
        first = attempts[0][10] if attempts else ended
        out.append(_decision_events(decision, _ns(first, offset)))
    messages = [b"".join(out)]
    for began, stopped in queued:
        begin_ns, stop_ns = _ns(began, offset), _ns(stopped, offset)
        messages.append(
            _ids(trace_id, new_span_id(), server_id)
            + _times(0x39, begin_ns, 0x41, stop_ns if stop_ns > begin_ns else begin_ns)
            + (_fixed.get(("queue", route)) or _kept(("queue", route), _queue_block(route)))
        )
    previous: bytes | None = None
    for index, attempt in enumerate(attempts):
        span_id = attempt[9] or new_span_id()
        body = _attempt_message(
            trace_id, span_id, server_id, attempt, offset, usage_bytes if single else None
        )
        body += _int(_ATTEMPT, index + 1)
        if attempt[8] is not None and previous is not None:  # a takeover: linked to the cut attempt
            # Link 13 {trace_id 1, span_id 2, attributes 4, flags 6}
            link = b"\x0a\x10" + trace_id + b"\x12\x08" + previous + _RESUMES_LINK
            body += len_field(13, link)
            # Also as an attribute: some stores (Phoenix) keep no links.
            body += attributes(9, {"gateway.resumes_span_id": previous.hex()})
        messages.append(body)
        previous = span_id
    return messages


def _server_block(record: RequestRecord) -> bytes:
    operation, route, stream, status, error, cost_basis, reason, api_key, final, final_model = record[5:15]
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": route,
        "gen_ai.request.stream": stream,
        "gateway.route": route,
        "gateway.status": status,
    }
    for name, value in (
        ("gateway.cost_basis", cost_basis),
        ("gateway.decision.reason", reason),
        ("gateway.api_key", api_key),
        ("gateway.backend", final),
        ("gen_ai.response.model", final_model),
        ("error.type", error),
    ):
        if value is not None:
            attrs[name] = value
    block = text_field(5, f"{operation} {route}") + b"\x30" + varint(KIND_SERVER) + attributes(9, attrs)
    return block + (error_status(error) if error is not None else b"") + SAMPLED_FLAGS


def _queue_block(route: str) -> bytes:
    block = text_field(5, "gateway.queue") + b"\x30" + varint(KIND_INTERNAL)
    return block + attributes(9, {"gateway.route": route}) + SAMPLED_FLAGS


def _attempt_message(
    trace_id: bytes, span_id: bytes, parent: bytes, attempt: AttemptRecord, offset: float, usage: bytes | None
) -> bytes:
    """One attempt's client span; ``usage``: its usage block when already written (a request's only
    attempt has the server span's)."""
    start_ns, end_ns = _ns(attempt[10], offset), _ns(attempt[11], offset)
    a = attempt
    key = (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8])  # its block's key: ``attempt[:9]``
    out = [
        _ids(trace_id, span_id, parent),
        _times(0x39, start_ns, 0x41, end_ns if end_ns > start_ns else start_ns),
        _fixed.get(key) or _kept(key, _attempt_block(attempt)),
    ]
    status, error, ttft, first_answer, cost = attempt[5], attempt[12], attempt[13], attempt[14], attempt[15]
    if status != "ok":  # its message is free text (an upstream's words): written, never cached
        out.append(error_status(error or status))
    if ttft is not None:
        out.append(_TTFT + _double(ttft))
    if first_answer is not None:
        out.append(_FIRST_ANSWER + _double(first_answer))
    if cost is not None:
        out.append(_COST + _double(cost))
    if usage is None and attempt[16] is not None:
        usage = _usage(attempt[16])
    if usage:
        out.append(usage)
    return b"".join(out)


def _attempt_block(attempt: AttemptRecord) -> bytes:
    operation, backend, model, dialect, base_url, status, http_status, cost_basis, resumed = attempt[:9]
    model = model if model is not None else backend
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "gateway.backend": backend,
        "gateway.attempt.status": status,
    }
    if dialect is not None and base_url is not None:
        attrs["gen_ai.provider.name"] = PROVIDERS.get(dialect, dialect)
        attrs["gateway.dialect"] = dialect
        attrs.update(server_address(base_url))
    for name, value in (
        ("http.response.status_code", http_status),
        ("gateway.cost_basis", cost_basis),
        ("gateway.resumed", resumed),
    ):
        if value is not None:
            attrs[name] = value
    if status != "ok":
        attrs["error.type"] = status
    block = text_field(5, f"{operation} {model}") + b"\x30" + varint(KIND_CLIENT) + attributes(9, attrs)
    return block + SAMPLED_FLAGS


def _decision_events(decision: DecisionRecord, time_ns: int) -> bytes:
    """The decision (its order and reason) and one event per candidate it weighed: predicted TTFT p95,
    expected $ and the cached prompt tokens it counted on, or why it was left out. Event 11 {time 1,
    name 2, attributes 3}."""
    reason, order, expected_cost, candidates = decision
    when = b"\x09" + _fixed64(time_ns)
    key = (reason, order)
    head = _fixed.get(key) or _kept(key, _decision_head(reason, order))
    out = [len_field(11, when + head + _DECISION_COST + _double(expected_cost))]
    for candidate in candidates:
        flags = (candidate[0], candidate[1], candidate[2], candidate[3])
        body = [when, _fixed.get(flags) or _kept(flags, _candidate_head(flags))]
        body.append(_int(_CANDIDATE_CACHED, candidate[4]))
        ttft, cost = candidate[5], candidate[6]
        if ttft is not None:
            body.append(_CANDIDATE_TTFT + _double(ttft))
        if cost is not None:
            body.append(_CANDIDATE_COST + _double(cost))
        out.append(len_field(11, b"".join(body)))
    return b"".join(out)


def _decision_head(reason: str, order: tuple[str, ...]) -> bytes:
    attrs: dict[str, AttributeValue] = {
        "gateway.decision.reason": reason,
        "gateway.decision.order": list(order),
    }
    return text_field(2, "gateway.decision") + attributes(3, attrs)


def _candidate_head(key: tuple[str, bool, bool, tuple[str, ...]]) -> bytes:
    backend, eligible, feasible, blocked_by = key
    attrs: dict[str, AttributeValue] = {
        "gateway.backend": backend,
        "gateway.candidate.eligible": eligible,
        "gateway.candidate.feasible": feasible,
    }
    if blocked_by:
        attrs["gateway.candidate.blocked_by"] = list(blocked_by)
    return text_field(2, "gateway.candidate") + attributes(3, attrs)
