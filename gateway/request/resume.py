"""Streams that survive their backend: a stream cut after its first byte goes on from another candidate.

The relay has seen every event it passed on, so it knows the answer so far (``Transcript``). When the
upstream breaks off, the next candidate of the same model family is asked to continue that answer
(vLLM, SGLang and llama-server: ``continue_final_message``; Kimi-style APIs: a ``partial`` final
assistant message; Anthropic-style: an assistant prefill), and its events are rewritten
(``ContinuedEvents``) so the client reads one stream: the same ``id``, no second role delta, the continued
answer as ``content``, and a single usage at the end that sums what each backend generated. A cut during
thinking, before any answer, restarts the request on the new backend (its thinking starts over; the
attempt says so). Only chat streams are resumed.

A continued answer is answer, whatever field the new backend puts it in: an engine's reasoning parser
may start inside the think channel (SGLang's unless the prefix holds the think-end marker; vLLM's unless
the rendered prompt's newest think marker closes it), and would stream the rest of the answer as
reasoning. vLLM and llama-server are given the thinking so far with the prefill (``reasoning``,
``reasoning_content``), which they render as a closed think channel before the answer; everywhere, once
the transcript says the answer had begun, what the new backend sends as reasoning is measured and
relayed as content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.backends.continuation import continuation_body
from gateway.errors import AttemptFailure
from gateway.measure.meter import StreamMeter
from gateway.measure.transcript import Transcript
from gateway.request.first_events import first_events
from gateway.telemetry.content import KEPT_STREAM_CHARS
from gateway.values.dialect import REASONING_FIELDS
from gateway.values.observation import Attempt, Usage

if TYPE_CHECKING:
    from gateway.backends.base import Upstream
    from gateway.request.exchange import Exchange


def transcript_for(exchange: Exchange) -> Transcript | None:
    """A transcript when this request's stream may be resumed, or when its trace may hold the answer
    (``telemetry.content``: then it keeps at most what the trace holds); else None (and no cost per
    chunk)."""
    client, trace = exchange.client, exchange.trace
    if client is None:
        return None
    transcript = None
    if client.route.resume_streams and exchange.door.upstream_path == "/chat/completions":
        transcript = Transcript()
    if trace is not None and trace.keeps_content(client.route):
        transcript = transcript or Transcript(resumes=False, keep_chars=KEPT_STREAM_CHARS)
        trace.answer = transcript
    return transcript


@dataclass(slots=True)
class Resumed:
    """The stream's continuation: where its bytes come from now, and its first events."""

    upstream: Upstream
    meter: StreamMeter
    attempt: Attempt
    first: bytes
    rewrite: ContinuedEvents
    rest: bytes  # the rest of the first events' read, not yet measured (``first_events``)


async def resume_stream(exchange: Exchange, meter: StreamMeter, failure: AttemptFailure) -> Resumed | None:
    """Close the cut attempt and open the next candidate that can continue the answer; None when none
    can (not resumable, no candidate left, the deadline or the attempt limit reached, client gone)."""
    transcript, client, runtime = meter.transcript, exchange.client, exchange.runtime
    observation = exchange.observation
    assert transcript is not None and client is not None and observation is not None
    cut = observation.attempts[-1]
    meter.finish(runtime.clock())
    exchange.end_attempt()
    if not transcript.resumable or exchange.client_gone:
        return None
    answer = "".join(transcript.answer)
    generated = sum(a.usage.completion_tokens for a in observation.attempts if a.usage is not None)
    if client.max_tokens is not None and generated >= client.max_tokens:
        return None  # nothing left to generate
    family = exchange.policy.backends[cut.backend].family
    fallback = client.route.fallback
    deadline = exchange.started_at + fallback.deadline_s
    tried = {a.backend for a in observation.attempts}
    for name in exchange.order:
        backend = exchange.policy.backends[name]
        remaining = deadline - runtime.clock()
        if len(observation.attempts) >= fallback.max_attempts or remaining <= 0:
            return None
        if name in tried or backend.family != family or (answer and backend.resume == "none"):
            continue
        if not runtime.allows(name):
            continue
        attempt = exchange.begin_attempt(name)
        attempt.resumed = "continued" if answer else "restarted"
        reasoning = "".join(transcript.reasoning)
        body = continuation_body(
            client.payload, backend, answer, reasoning, client.max_tokens, generated, client.cache_salt
        )
        call = exchange.call(
            backend, "/chat/completions", body, True, min(backend.timeouts.first_byte_s, remaining)
        )
        next_meter = StreamMeter(
            attempt,
            client_wants_usage=False,
            prompt_tokens=client.prompt_tokens,
            transcript=transcript,
            continues_answer=bool(answer),
        )
        try:
            upstream = await exchange.open(call)
            first, rest = await first_events(upstream, next_meter, call, runtime.clock)
        except AttemptFailure as exc:
            attempt.status = "timeout" if exc.kind == "timeout" else "upstream_error"
            attempt.error, attempt.http_status = exc.message, exc.http_status
            exchange.end_attempt()
            continue
        upstream.expect_chunks_within(backend.timeouts.idle_s)
        transcript.takeovers.append(
            {"from": cut.backend, "to": name, "mode": attempt.resumed, "after_chunks": len(transcript.answer)}
        )
        rewrite = ContinuedEvents(exchange, transcript, next_meter, client.wants_usage)
        return Resumed(upstream, next_meter, attempt, rewrite(first), rewrite, rest)
    return None


class ContinuedEvents:
    """Rewrites a continuation's events into the stream the client has been reading."""

    __slots__ = ("_attempt", "_earlier", "_exchange", "_meter", "_transcript", "_wants_usage")

    def __init__(
        self, exchange: Exchange, transcript: Transcript, meter: StreamMeter, wants_usage: bool
    ) -> None:
        assert exchange.observation is not None
        self._exchange = exchange
        self._attempt = exchange.observation.attempts[-1]  # the one taking over
        earlier = exchange.observation.attempts[:-1]
        self._transcript = transcript
        self._earlier = earlier  # the attempts before this one, their usage settled
        self._meter = meter
        self._wants_usage = wants_usage

    def __call__(self, events: bytes) -> bytes:
        sep = b"\r\n\r\n" if b"\r\n\r\n" in events else b"\n\n"
        out: list[bytes] = []
        for event in events.split(sep):
            if not event:
                continue
            data = event[5:].strip() if event.startswith(b"data:") else None
            if data == b"[DONE]":
                out.append(b"data: " + orjson.dumps(self._last_chunk()))
                out.append(event)
                continue
            rewritten = self._rewrite(data)
            if rewritten is not None:
                out.append(rewritten)
        return b"".join(event + b"\n\n" for event in out)

    def _rewrite(self, data: bytes | None) -> bytes | None:
        try:
            obj = orjson.loads(data) if data is not None else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            return None  # comments and keep-alives of the new upstream: nothing the client needs
        transcript = self._transcript
        obj["id"], obj["model"] = transcript.stream_id, transcript.model
        if transcript.created is not None:
            obj["created"] = transcript.created
        obj.pop("usage", None)  # one usage, summed, at the end
        choices = obj.get("choices")
        if not choices:
            return None
        continued = self._attempt.resumed == "continued"
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                delta.pop("role", None)  # the client had its role delta from the first backend
                if continued:  # the rest of an answer, even where the backend's parser took it for thinking
                    _as_content(delta)
                if not any(delta.values()) and choice.get("finish_reason") is None:
                    return None  # nothing left in it
        return b"data: " + orjson.dumps(obj)

    def _last_chunk(self) -> dict[str, Any]:
        transcript = self._transcript
        chunk: dict[str, Any] = {
            "id": transcript.stream_id,
            "object": "chat.completion.chunk",
            "created": transcript.created,
            "model": transcript.model,
            "choices": [],
            "x_gateway_resumed": transcript.takeovers,
        }
        if self._wants_usage:
            usage = self._meter.usage_so_far()
            chunk["usage"] = usage_json([*(a.usage for a in self._earlier), usage])
            cost, basis = self._exchange.cost_so_far(self._attempt, usage)
            chunk["usage"]["cost"], chunk["usage"]["cost_basis"] = round(cost, 10), basis or ""
        return chunk


def _as_content(delta: dict[str, Any]) -> None:
    for field in REASONING_FIELDS:
        text = delta.pop(field, None)
        if isinstance(text, str) and text:
            delta["content"] = (delta.get("content") or "") + text


def usage_json(parts: list[Usage | None]) -> dict[str, Any]:
    """The OpenAI ``usage`` object of several attempts together: what every backend generated."""
    prompt = completion = reasoning = cached = 0
    for usage in parts:
        if usage is not None:
            prompt += usage.prompt_tokens
            completion += usage.completion_tokens
            reasoning += usage.reasoning_tokens
            cached += usage.cached_prompt_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
