"""A settled request as one flat record: the values its spans are written from, taken on the request path
the moment it settles (``request_record``) and written to spans by the exporter as it posts the batch.

Why a record, and not the request's own objects: the exporter may write a request's spans up to a second
later (and once did so in a thread of its own). Handed the ``Observation`` and the ``Decision``, it
would read objects the request path made (a decision's candidates are built lazily, on first read) and
keep a dozen of them alive per request until then, which the cyclic collector walks again and again and
which are out of the CPU's caches by the time they are read. A record holds only strings, numbers,
bytes and tuples of them: immutable, so nothing can see it change, and out of the collector's sight
once it has looked at it once. Its fields are ordered so that the values a span's cached block is
written from are side by side (``encode`` looks its blocks up by ``record[5:15]`` and ``attempt[:9]``,
read field by field).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.telemetry.content import KEPT_STREAM_CHARS, AnswerRecord, StreamedChoice, input_messages
from gateway.telemetry.spans import OPERATIONS
from gateway.values.observation import Attempt, Observation

if TYPE_CHECKING:
    from gateway.policy.compiled import CompiledBackend
    from gateway.policy.decide import Decision

# input, output, cache read, reasoning tokens; counted (the gateway's estimate) rather than reported
UsageRecord = tuple[int, int, int, int, bool]
# The key of its cached block first: operation, backend, model, dialect, base URL (these three None
# for a backend the policy no longer names), status, HTTP status, cost basis, resumed; then span id
# (None: made when written), started and ended (the gateway's clock), error message, TTFT, first
# answer, cost, usage.
AttemptRecord = tuple[
    str,
    str,
    str | None,
    str | None,
    str | None,
    str,
    int | None,
    str | None,
    str | None,
    bytes | None,
    float,
    float,
    str | None,
    float | None,
    float | None,
    float | None,
    UsageRecord | None,
]
# backend, eligible, feasible, blocked by (its cached block's key); expected cached tokens, predicted
# TTFT p95, expected cost
CandidateRecord = tuple[str, bool, bool, tuple[str, ...], int, float | None, float | None]
# reason, order (its cached block's key); expected cost, the candidates
DecisionRecord = tuple[str, tuple[str, ...], float, tuple[CandidateRecord, ...]]

# Server span: trace id, span id, the client's span id (b"": a trace the gateway began), tracestate,
# wall clock minus the gateway's; then its cached block's key: operation, route, stream, status, error
# type (None: ok), cost basis, decision reason, API key name, final backend, its model; then request
# id, started, ended, max_tokens, cost, queued seconds, expected cached tokens, the attempts, the waits
# in the route's queue, the decision, the prompt (JSON) and the answer when the policy lets them in.
RequestRecord = tuple[
    bytes,
    bytes,
    bytes,
    str,
    float,
    str,
    str,
    bool,
    str,
    str | None,
    str | None,
    str | None,
    str | None,
    str | None,
    str | None,
    str,
    float,
    float,
    int | None,
    float,
    float,
    int | None,
    tuple[AttemptRecord, ...],
    tuple[tuple[float, float], ...],
    DecisionRecord | None,
    str | None,
    AnswerRecord | None,
]
NO_SPAN_IDS: Mapping[int, bytes] = {}


class StreamedAnswer(Protocol):
    """What a stream's meter keeps of the answer for a trace (``measure.transcript.Transcript``)."""

    answer: list[str]
    calls: list[list[Any]]  # [index, id, name, argument fragments] of each tool call
    finish_reason: str | None
    more: Any  # the other choices of a stream of several (n > 1), by index: each a StreamedAnswer


def request_record(
    ids: tuple[bytes, bytes, bytes, str, float],
    attempt_span_ids: Mapping[int, bytes],
    queued: Sequence[tuple[float, float]],
    observation: Observation,
    decision: Decision | DecisionRecord | None,
    backends: Mapping[str, CompiledBackend],
    prompt: object | None = None,
    answer: bytes | StreamedAnswer | None = None,
) -> RequestRecord:
    """The record of a settled request; ``prompt`` and ``answer`` only when the policy lets them in;
    ``decision``: its record when taken already (``RequestTrace.decided``)."""
    operation = OPERATIONS.get(observation.endpoint, observation.endpoint)
    status = observation.status
    attempts = observation.attempts
    end = observation.finished_at
    final = attempts[-1].backend if attempts else None
    final_backend = None if final is None else backends.get(final)
    return (
        *ids,
        operation,
        observation.route,
        observation.stream,
        status,
        None if status == "ok" else (observation.error_type or status),
        observation.cost_basis,
        observation.decision_reason,
        observation.api_key_name,
        final,
        None if final_backend is None else final_backend.model,
        observation.request_id,
        observation.started_at,
        observation.started_at if end is None else end,
        observation.max_tokens,
        observation.cost_usd or 0.0,
        observation.queued_s,
        observation.predicted_cached_tokens,
        tuple([_attempt(operation, a, backends, attempt_span_ids.get(i)) for i, a in enumerate(attempts)]),
        tuple(queued),
        decision if decision is None or isinstance(decision, tuple) else decision_record(decision),
        None if prompt is None else input_messages(prompt),
        _answer(answer),
    )


def _attempt(
    operation: str, attempt: Attempt, backends: Mapping[str, CompiledBackend], span_id: bytes | None
) -> AttemptRecord:
    backend = backends.get(attempt.backend)
    usage = attempt.usage
    end = attempt.finished_at
    return (
        operation,
        attempt.backend,
        None if backend is None else backend.model,
        None if backend is None else backend.dialect,
        None if backend is None else backend.base_url,
        attempt.status,
        attempt.http_status,
        attempt.cost_basis,
        attempt.resumed,
        span_id,
        attempt.started_at,
        attempt.started_at if end is None else end,
        attempt.error,
        attempt.ttft_s,
        attempt.first_answer_s,
        attempt.cost_usd,
        None
        if usage is None
        else (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_prompt_tokens,
            usage.reasoning_tokens,
            usage.source == "counted",
        ),
    )


def decision_record(decision: Decision) -> DecisionRecord:
    """The decision's candidates, built here (``Decision.evals`` is lazy) from the snapshot it decided
    on, so the exporter never reads the ``Decision``."""
    cached = decision.cached_tokens
    return (
        decision.reason,
        decision.order,
        decision.expected_cost_usd or 0.0,
        tuple(
            [
                (
                    c.backend,
                    c.eligible,
                    c.feasible,
                    c.blocked_by,
                    cached.get(c.backend, 0),
                    c.ttft_p95_s,
                    c.expected_cost_usd,
                )
                for c in decision.evals
            ]
        ),
    )


def _answer(answer: bytes | StreamedAnswer | None) -> AnswerRecord | None:
    if answer is None or isinstance(answer, bytes):
        return answer
    # The stream's text joined now (its meter's list is the request's, not the exporter's), as much as
    # the writer keeps: a stream that may be resumed keeps the whole answer. One entry per choice.
    choices = [answer]
    if answer.more:
        choices += [answer.more[index] for index in sorted(answer.more)]
    return tuple([_choice(choice) for choice in choices])


def _choice(answer: StreamedAnswer) -> StreamedChoice:
    calls = tuple([(c[1], c[2], "".join(c[3])) for c in answer.calls])
    return "".join(answer.answer)[:KEPT_STREAM_CHARS], answer.finish_reason, calls
