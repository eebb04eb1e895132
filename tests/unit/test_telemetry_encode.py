"""The exporter's span writer (gateway/telemetry/encode.py) against the readable span model it replaced
on the hot path (gateway/telemetry/spans.py): every span, attribute, event, link and status the same,
read back by the tests' own protobuf reader; and its cached blocks never leak one request's values
into another's."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from gateway.policy.decide import Decision
from gateway.policy.evaluate import CandidateEval
from gateway.policy.load import load_policy
from gateway.policy.schema import Slo
from gateway.telemetry import tracer as tracer_module
from gateway.telemetry.content import input_messages, output_messages
from gateway.telemetry.encode import request_messages
from gateway.telemetry.otlp import envelope, export_body, export_request, len_field
from gateway.telemetry.record import RequestRecord, decision_record, request_record
from gateway.telemetry.spans import TraceIds, request_spans
from gateway.telemetry.tracer import RequestTrace, Tracer
from gateway.values.observation import Attempt, Observation, Usage
from tests.servers import free_port
from tests.telemetry.receiver import ReadSpan, exporter_settings, spans_of

POLICY = "bench/policy.yaml"
RESOURCE = {"service.name": "t", "service.version": "1"}
SCOPE = ("s", "1")


def candidate(
    backend: str, ttft: float | None, cost: float | None, blocked: tuple[str, ...]
) -> CandidateEval:
    measured = ttft is not None
    return CandidateEval(
        backend, not blocked, measured, measured, ttft, ttft, 90.0, 0.0, 15.0, cost, 16.0, True, None, None,
        None, 0, None, blocked, Slo(),
    )  # fmt: skip


def settled(seed: int) -> tuple[TraceIds, Observation, Decision]:
    """A streamed request whose first attempt was cut and taken over, queued once, with a client parent,
    a tracestate and every optional figure; ``seed`` moves every number."""
    cut = Attempt(
        "bench-upstream",
        10.0 + seed,
        status="dropped",
        http_status=200,
        error=f"upstream closed after {seed} chunks",
        ttft_s=0.01 * seed,
        finished_at=10.5 + seed,
        usage=Usage(100 + seed, 9, 3),
        cost_usd=0.001 * seed,
        cost_basis="per_token",
    )
    resumed = Attempt(
        "bench-upstream-paced",
        10.5 + seed,
        http_status=200,
        ttft_s=0.2,
        first_answer_s=0.3 + seed,
        finished_at=11.0 + seed,
        usage=Usage(120, 20 + seed, 0, 64, "counted"),
        resumed="continued",
    )
    observation = Observation(
        f"request-{seed}",
        "bench-fast",
        "chat",
        True,
        9.0 + seed,
        max_tokens=64 + seed,
        api_key_name="k",
        decision_reason="cheapest_within_slo",
        attempts=[cut, resumed],
        finished_at=11.0 + seed,
        cost_usd=0.5 * seed,
        cost_basis="per_token",
        queued_s=0.75,
        predicted_cached_tokens=seed,
        status="error",
        error_type="upstream_error",
    )
    ids = TraceIds(bytes(15) + bytes((seed + 1,)), bytes(7) + b"\x01", bytes(7) + b"\x02", "v=1", 1000.0)
    ids.attempt_span_ids.update({0: bytes(7) + b"\x03", 1: bytes(7) + b"\x04"})
    ids.queued.append((9.1 + seed, 9.85 + seed))
    evals = (
        candidate("bench-upstream", 0.25 * seed, 0.002 * seed, ()),
        candidate("bench-upstream-paced", None, None, ("circuit open",)),
    )
    decision = Decision(
        ("bench-upstream", "bench-upstream-paced"),
        "cheapest_within_slo",
        evals,
        0.003 * seed,
        {"bench-upstream": 10 * seed},
    )
    return ids, observation, decision


def record_of(
    ids: TraceIds,
    observation: Observation,
    decision: Decision | None,
    backends: Any,
    prompt: object = None,
    answer: bytes | None = None,
) -> RequestRecord:
    id_values = (ids.trace_id, ids.server_span_id, ids.parent_span_id, ids.trace_state, ids.wall_offset_s)
    return request_record(
        id_values, ids.attempt_span_ids, ids.queued, observation, decision, backends, prompt, answer
    )


def read(spans: list[ReadSpan]) -> list[dict[str, Any]]:
    out = []
    for span in spans:
        found = dataclasses.asdict(span)
        if span.name == "gateway.queue":  # its id is made where it is written
            found["span_id"] = "queue"
        out.append(found)
    return out


def test_the_writer_says_what_the_span_model_says() -> None:
    backends = load_policy(POLICY).backends
    for seed in (1, 2, 3, 1):  # the same shapes again: the cached blocks in play
        ids, observation, decision = settled(seed)
        answer = b'{"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}]}'
        record = record_of(ids, observation, decision, backends, [{"role": "user"}], answer)
        written = request_messages(record)
        ours = read(spans_of(export_body(envelope(RESOURCE, SCOPE), written)))
        said = output_messages(answer, "chat", ok=False)
        model = request_spans(ids, observation, decision, backends, input_messages([{"role": "user"}]), said)
        assert ours == read(spans_of(export_request(RESOURCE, SCOPE, model)))
        server = ours[0]["attributes"]
        assert (
            server["gateway.request_id"] == f"request-{seed}"
            and server["gen_ai.request.max_tokens"] == 64 + seed
        )
        assert server["gen_ai.output.messages"] == (
            '[{"role":"assistant","parts":[{"type":"text","content":"hi"}],"finish_reason":"length"}]'
        )
        assert ours[2]["attributes"]["gateway.cost_usd"] == 0.001 * seed


def test_a_request_without_decision_usage_or_content() -> None:
    backends = load_policy(POLICY).backends
    bare = Observation(
        "r", "bench-fast", "completions", False, 5.0, attempts=[Attempt("bench-upstream", 5.0)]
    )
    ids = TraceIds(bytes(15) + b"\x09", bytes(7) + b"\x05", b"", "", 0.0)
    ids.attempt_span_ids[0] = bytes(7) + b"\x06"
    written = spans_of(
        export_body(envelope(RESOURCE, SCOPE), request_messages(record_of(ids, bare, None, backends)))
    )
    model = spans_of(export_request(RESOURCE, SCOPE, request_spans(ids, bare, None, backends, None)))
    assert read(written) == read(model)
    assert "gen_ai.input.messages" not in written[0].attributes and written[0].parent_span_id == ""


def immutable(value: object) -> bool:
    """Only strings, bytes, numbers, None and tuples of them: nothing anyone can change."""
    if isinstance(value, tuple):
        return all(immutable(item) for item in value)
    return value is None or isinstance(value, (str, bytes, int, float))


def test_a_record_holds_only_immutable_values_taken_when_the_request_settles() -> None:
    """A record may be written to spans a batch later: nothing in one may be an object the request path still
    holds (the decision's candidates, built lazily, are built by whoever takes the record)."""
    backends = load_policy(POLICY).backends
    ids, observation, eager = settled(2)
    built_by: list[int] = []

    def candidates() -> tuple[CandidateEval, ...]:
        built_by.append(threading.get_ident())
        return eager.evals

    lazy = Decision(eager.order, eager.reason, candidates, eager.expected_cost_usd, eager.cached_tokens)
    record = record_of(ids, observation, lazy, backends, [{"role": "user"}], b'{"choices": []}')
    assert built_by == [threading.get_ident()]

    assert immutable(record)
    observation.attempts[0].usage = Usage(1, 1)  # the request's objects change: the record does not
    assert record == record_of(ids, settled(2)[1], eager, backends, [{"role": "user"}], b'{"choices": []}')


async def test_a_traced_request_takes_its_decision_into_its_record_when_it_is_made() -> None:
    """``RequestTrace.decided``: the candidates are evaluated while what the decision read is at hand,
    and the record the request settles with (queued, its spans written as its batch is posted) holds
    that decision's record."""
    policy = load_policy(POLICY)
    ids, observation, eager = settled(3)
    built: list[int] = []

    def candidates() -> tuple[CandidateEval, ...]:
        built.append(1)
        return eager.evals

    lazy = Decision(eager.order, eager.reason, candidates, eager.expected_cost_usd, eager.cached_tokens)
    # A real tracer (compiled, it takes no stand-in), its exporter's queue read before any post: the
    # flush interval is an hour, and at the end the post goes to a port nobody listens on.
    settings = exporter_settings(f"http://127.0.0.1:{free_port()}", 10, 3600.0)
    tracer = Tracer(settings, time.monotonic, time.time)
    id_values = (ids.trace_id, ids.server_span_id, ids.parent_span_id, ids.trace_state, ids.wall_offset_s)
    trace = RequestTrace(tracer, id_values, None)
    trace.decided(lazy)
    assert built == [1], "evaluated when decided"
    later = Decision(("bench-upstream-paced",), "exploration", (), None)
    trace.finish(observation, later, None, policy)
    queued = list(tracer.exporter._queue)
    await tracer.close()
    (record,) = queued
    assert isinstance(record, tuple) and immutable(record), "the record is queued, not the request's objects"
    assert record[24] == decision_record(eager)
    assert record[:22] == record_of(ids, observation, eager, policy.backends)[:22]
    # The exporter writes it as it posts the batch: the spans the writer makes of that record (the
    # attempts' span ids, never sent upstream here, are made as they are written).
    spans = tracer_module.span_messages(record)
    assert len(spans) == tracer_module.span_count(record) == 1 + 2  # the server's, two attempts'
    assert spans[0] == request_messages(record)[0]


@pytest.mark.parametrize("sizes", [(), (0,), (127, 128), (16_383, 16_384), (900, 300, 1_400) * 300])
def test_the_export_body_is_the_nested_messages_written_in_one_join(sizes: tuple[int, ...]) -> None:
    """export_body sums the lengths first and joins once; it must write the bytes that nesting each
    length-delimited message in the next would (lengths of one, two and three varint bytes included)."""
    parts = envelope(RESOURCE, SCOPE)
    spans = [bytes([n % 251]) * n for n in sizes]
    resource, scope = parts
    nested = len_field(1, resource + len_field(2, scope + b"".join(len_field(2, span) for span in spans)))
    assert export_body(parts, spans) == nested
