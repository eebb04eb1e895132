"""The request lifecycle, top to bottom: read, route, decide, attempt with fallback, relay, observe.

Handlers in ``api/openai.py`` call ``complete()``; everything a request does happens in the named
steps below, and every outcome (success, fallback, failure) lands in one ``Observation``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import authorize_route
from gateway.backends.openai_compat import expect_chunks_within, iter_chunks
from gateway.dialect import estimate_tokens, prompt_chars, read_completion
from gateway.errors import (
    AttemptFailure,
    BodyTooLarge,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoRouteAvailable,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.observation import Attempt, Observation
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.runtime import Runtime
from gateway.streaming import StreamMeter, StreamRelay

Endpoint = Literal["chat", "completions"]
UPSTREAM_PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions"}
REQUIRED_FIELD: dict[str, str] = {"chat": "messages", "completions": "prompt"}


@dataclass(slots=True)
class ClientRequest:
    payload: dict[str, Any]
    route: CompiledRoute
    stream: bool
    wants_usage: bool
    prompt_chars: int
    max_tokens: int | None


async def complete(runtime: Runtime, request: Request, endpoint: Endpoint) -> Response | StreamRelay:
    policy = runtime.policy
    started = runtime.clock()
    key = runtime.authenticate(request.headers)
    body = await read_body(request, policy.max_body_bytes)
    client = parse_request(body, endpoint, policy)
    authorize_route(key, client.route.name)
    observation = Observation(
        request_id=request_id(request, runtime),
        route=client.route.name,
        endpoint=endpoint,
        stream=client.stream,
        started_at=started,
        prompt_chars=client.prompt_chars,
        max_tokens=client.max_tokens,
        api_key_name=None if key is None else key.name,
    )
    decision = runtime.decide(
        client.route, estimate_tokens(client.prompt_chars), client.max_tokens, client.stream
    )
    observation.decision_reason = decision.reason
    observation.expected_cost_usd = decision.expected_cost_usd
    if not decision.order:
        runtime.request_failed(observation, "no_backend_available")
        raise NoRouteAvailable(
            f"route '{client.route.name}' has no backend to take this request: {decision.reason}"
        )
    order = await runtime.admit(observation, client.route, decision)
    try:
        return await attempt_in_order(runtime, policy, client, observation, order, endpoint)
    except BaseException as exc:
        runtime.request_abandoned(observation, exc)  # a no-op when a step already settled it
        raise


async def attempt_in_order(
    runtime: Runtime,
    policy: CompiledPolicy,
    client: ClientRequest,
    observation: Observation,
    order: tuple[str, ...],
    endpoint: Endpoint,
) -> Response | StreamRelay:
    """Try each chosen backend until one answers; fall back only while no byte reached the client."""
    deadline = observation.started_at + client.route.fallback.deadline_s
    failure: AttemptFailure | None = None
    for name in order[: client.route.fallback.max_attempts]:
        remaining = deadline - runtime.clock()
        if remaining <= 0:
            break
        if observation.attempts and not runtime.allows(name):
            continue
        backend = policy.backends[name]
        attempt = runtime.attempt_started(observation, name)
        body = upstream_body(client, backend)
        try:
            if client.stream:
                return await open_stream(
                    runtime, backend, client, observation, attempt, body, endpoint, remaining
                )
            return await complete_once(
                runtime, backend, client, observation, attempt, body, endpoint, remaining
            )
        except AttemptFailure as exc:
            failure = exc
            attempt.status = "timeout" if exc.kind == "timeout" else "upstream_error"
            attempt.error, attempt.http_status = exc.message, exc.http_status
            attempt.finished_at = runtime.clock()
            runtime.attempt_finished(observation, attempt)
            if exc.client_fault is not None:
                runtime.request_failed(observation, "upstream_rejected_request")
                raise exc.client_fault from None
    runtime.request_failed(observation, "upstream_failed")
    raise final_error(failure, len(observation.attempts))


async def open_stream(
    runtime: Runtime,
    backend: CompiledBackend,
    client: ClientRequest,
    observation: Observation,
    attempt: Attempt,
    body: bytes,
    endpoint: Endpoint,
    remaining_s: float,
) -> StreamRelay:
    """Open the upstream stream and wait for its first event: until then a failure can still fall back."""
    first_byte_s = min(backend.timeouts.first_byte_s, remaining_s)
    path = UPSTREAM_PATHS[endpoint]
    response = await runtime.upstream.open(backend, path, body, wait_s=first_byte_s, stream=True)
    meter = StreamMeter(attempt, client_wants_usage=client.wants_usage, prompt_chars=client.prompt_chars)
    chunks = iter_chunks(backend, response)
    first = b""
    try:
        async with asyncio.timeout(first_byte_s):
            while not first:
                data = await anext(chunks, None)
                if data is None:
                    raise AttemptFailure("dropped", f"{backend.name}: stream ended before its first event")
                first = meter.feed(data, runtime.clock())
    except TimeoutError:
        response.close()
        raise AttemptFailure("timeout", f"{backend.name}: no first token in {first_byte_s:g}s") from None
    except AttemptFailure:
        response.close()
        raise
    expect_chunks_within(response, backend.timeouts.idle_s)

    def finish() -> None:
        runtime.attempt_finished(observation, attempt)
        runtime.request_finished(observation)

    return StreamRelay(
        headers=response_headers(observation, runtime, "text/event-stream"),
        first=first,
        chunks=chunks,
        meter=meter,
        attempt=attempt,
        clock=runtime.clock,
        release=lambda: response.release() if response.content.is_eof() else response.close(),
        on_finish=finish,
    )


async def complete_once(
    runtime: Runtime,
    backend: CompiledBackend,
    client: ClientRequest,
    observation: Observation,
    attempt: Attempt,
    body: bytes,
    endpoint: Endpoint,
    remaining_s: float,
) -> Response:
    # A whole answer's headers come only once it is complete, so its wait is the answer's, not a token's.
    wait_s = min(backend.timeouts.answer_s, remaining_s)
    path = UPSTREAM_PATHS[endpoint]
    response = await runtime.upstream.open(backend, path, body, wait_s=wait_s, stream=False)
    raw = await runtime.upstream.read_body(backend, response, max(remaining_s, 1.0))
    response.release()
    attempt.finished_at = runtime.clock()
    attempt.usage, decode_s = read_completion(raw, client.prompt_chars)
    duration = attempt.finished_at - attempt.started_at
    if decode_s is not None:  # llama.cpp says how long decoding took: the rest was waiting for token one
        attempt.decode_s = min(decode_s, duration)
        attempt.ttft_s = duration - attempt.decode_s
    else:  # the backend's usual first-token wait, measured on its streams, was not decoding
        usual_ttft = runtime.stats.view(backend.name).ttft_p50_s or 0.0
        attempt.decode_s = duration - usual_ttft if usual_ttft < duration else duration
    runtime.attempt_finished(observation, attempt)
    runtime.request_finished(observation)
    reply = Response(raw)  # the upstream's bytes as they came; only our headers are added
    reply.raw_headers = [*reply.raw_headers, *response_headers(observation, runtime, "application/json")]
    return reply


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {int(declared)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes, endpoint: Endpoint, policy: CompiledPolicy) -> ClientRequest:
    if not body:
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    route = policy.routes.get(model)
    if route is None:
        known = ", ".join(sorted(policy.routes))
        raise ModelNotFound(f"The model '{model[:200]}' does not exist. Known models: {known}")
    field = REQUIRED_FIELD[endpoint]
    value = payload.get(field)
    if endpoint == "chat" and (not isinstance(value, list) or not value):
        raise InvalidRequest("'messages' is required and must be a non-empty array", param="messages")
    if endpoint == "completions" and not isinstance(value, (str, list)):
        raise InvalidRequest("'prompt' is required and must be a string or an array", param="prompt")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise InvalidRequest("'max_tokens' must be a positive integer", param="max_tokens")
    return ClientRequest(
        payload=payload,
        route=route,
        stream=stream,
        wants_usage=bool(stream and options and options.get("include_usage")),
        prompt_chars=prompt_chars(payload),
        max_tokens=max_tokens,
    )


def upstream_body(client: ClientRequest, backend: CompiledBackend) -> bytes:
    """The client's body with the backend's model name; streams always ask for usage (stripped again
    by the relay when the client did not ask), so every streamed token is accounted for."""
    payload = dict(client.payload)
    payload["model"] = backend.model
    if client.stream:
        payload["stream_options"] = {**(client.payload.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(payload)


def response_headers(
    observation: Observation, runtime: Runtime, content_type: str
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", content_type.encode()),
        (b"x-request-id", observation.request_id.encode()),
        (b"x-gateway-route", observation.route.encode()),
        (b"x-gateway-backend", (observation.backend or "").encode()),
        (b"x-gateway-decision", (observation.decision_reason or "").encode()),
    ]
    cost = runtime.cost_header(observation)
    if cost is not None:
        basis = observation.cost_basis if observation.cost_usd is not None else "expected"
        headers += [(b"x-gateway-cost-usd", cost.encode()), (b"x-gateway-cost-basis", (basis or "").encode())]
    if content_type == "text/event-stream":
        headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    return headers


def final_error(failure: AttemptFailure | None, attempts: int) -> GatewayError:
    if failure is None:
        return UpstreamTimeout("the route's deadline passed before any backend could be tried")
    tried = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if failure.kind == "timeout":
        return UpstreamTimeout(f"no backend answered in time ({tried}; last: {failure.message})")
    return UpstreamError(
        f"every backend failed ({tried}; last: {failure.message})", retry_after=failure.retry_after
    )


def request_id(request: Request, runtime: Runtime) -> str:
    """The client's ``x-request-id`` when it looks like one, so logs can be joined; else a new one."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 64 and given.replace("-", "").replace("_", "").isalnum():
        return given
    return runtime.new_request_id()
