"""The request lifecycle, top to bottom: read, route, decide, admit, attempt with fallback, relay, settle.

``serve`` is the whole life of one completion request. Everything it does happens in the named
steps below, on one ``Exchange`` that is settled exactly once however the request ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.backends import UpstreamCall
from gateway.backends.chat_shape import shaped
from gateway.doors import ClientRequest, Door
from gateway.errors import (
    AttemptFailure,
    BodyTimeout,
    BodyTooLarge,
    GatewayError,
    InternalError,
    NoRouteAvailable,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.measure.meter import StreamMeter
from gateway.money.costs import bounded_max_tokens
from gateway.policy.compiled import CompiledBackend
from gateway.request.answer_headers import response_headers
from gateway.request.cache_keys import keys_for, with_cache_salt
from gateway.request.connection import body_arrived
from gateway.request.exchange import Exchange
from gateway.request.first_events import first_events
from gateway.request.privacy import take_identity, user_hash, with_identity
from gateway.request.refusals import named_in, observation_of, refuse
from gateway.request.resume import transcript_for
from gateway.request.streaming import StreamRelay
from gateway.runtime import Runtime
from gateway.runtime.drain import SHUTDOWN_CODE, UNANSWERED_MESSAGE
from gateway.runtime.waiting import retry_after_seconds, worth_waiting
from gateway.telemetry.context import trace_headers
from gateway.values.auth import authorize_route
from gateway.values.dialect import insert_usage_cost, read_completion, unusable_answer
from gateway.values.observation import Attempt, Observation

log = logging.getLogger("gateway")


async def serve(runtime: Runtime, door: Door, scope: Scope, receive: Receive, send: Send) -> None:
    """One request through ``door`` as a bare ASGI call; every error becomes the door's error body here."""
    if not runtime.in_flight.has_room(runtime.policy.server.max_in_flight):
        await shed(runtime, door, scope, receive, send)  # at the bound of requests in flight: body unread
        return
    request = Request(scope, receive)
    exchange = Exchange(runtime, door, request_id(scope["headers"], runtime))
    if runtime.tracer is not None:  # off by default: this check is all tracing costs then
        exchange.trace = runtime.tracer.begin(*trace_headers(scope["headers"]))
    drain = runtime.drain  # a graceful stop waits for every request in flight, then ends the rest
    drain.opened(exchange)
    try:
        await answer_and_send(exchange, request, scope, receive, send)
    finally:
        drain.closed(exchange)


async def answer_and_send(
    exchange: Exchange, request: Request, scope: Scope, receive: Receive, send: Send
) -> None:
    door = exchange.door
    try:
        response: Response | StreamRelay = await answer(exchange, request, receive)
    except GatewayError as exc:
        response = refusal(exchange, exc)
    except ClientDisconnect:  # gone while still sending its body: nobody to answer
        exchange.settle()
        return
    except asyncio.CancelledError:
        if not exchange.absorb_cancel():
            exchange.settle()
            raise
        if not exchange.stopped:  # gone while waiting for the upstream: its connection is cut
            exchange.settle()
            return
        # A graceful stop's grace ran out before the answer began: no byte sent, so the client may retry.
        response = refusal(exchange, NoRouteAvailable(UNANSWERED_MESSAGE, code=SHUTDOWN_CODE))
    except Exception:
        log.exception("unhandled error on POST %s", scope["path"])
        exchange.fail("internal_error")
        response = door.error_response(InternalError())
    if not isinstance(response, StreamRelay):
        # Before the answer goes out: whoever reads spend next sees this request. Its metrics wait for
        # the answer's write (``Exchange.count``, nothing awaited between: a scrape still sees them).
        exchange.settle(count_later=True)
    exchange.answering = True  # a graceful stop now ends a stream through its upstream: an error event
    try:
        await response(scope, receive, send)
    finally:
        exchange.settle()  # a stream settles at its end; this is a no-op then
        exchange.count()


def refusal(exchange: Exchange, error: GatewayError) -> Response:
    exchange.runtime.error_returned(error)
    observation = exchange.observation
    if error.refusal and (observation is None or not observation.attempts):
        refuse(exchange, error)  # turned away before any backend was tried: a row, a log line
    else:
        exchange.fail(error.code or error.type)
    return exchange.door.error_response(error)


async def answer(exchange: Exchange, request: Request, receive: Receive) -> Response | StreamRelay:
    runtime, policy = exchange.runtime, exchange.policy
    exchange.key = runtime.authenticate(policy, request.headers)
    server = policy.server
    arrived = body_arrived(request.scope)
    body = await read_body(request.headers, receive, policy.max_body_bytes, server.body_timeout_s, arrived)
    # The place is taken once the body is in: a body still trickling holds none.
    exchange.in_flight = runtime.in_flight.enter(server.max_in_flight)
    if not exchange.in_flight:
        raise Overloaded(server.max_in_flight, server.shed_retry_after_s)
    exchange.watch_client(request.scope, receive)
    client = exchange.client = parse(exchange, body)
    client.keys = keys_for(client, request.scope["headers"], policy, exchange.key, runtime.prefixes.carry)
    candidates = (policy.backends[name] for name in client.route.backends)
    client.max_tokens = bounded_max_tokens(client.max_tokens, client.prompt_tokens, candidates)
    observation = exchange.observation = observation_of(exchange, client.route.name, stream=client.stream)
    observation.user_hash = user_hash(client.identity, policy.user_hash_key)
    authorize_route(exchange.key, client.route.name)
    route, tokens = client.route, client.prompt_tokens
    decision = exchange.decided(
        runtime.decide(policy, route, tokens, client.max_tokens, client.stream, client.keys)
    )
    observation.decision_reason = decision.reason
    observation.expected_cost_usd = decision.expected_cost_usd
    if not decision.order:
        if not worth_waiting(decision):
            raise NoRouteAvailable(
                f"route '{client.route.name}' has no backend to take this request: {decision.reason}"
            )
        await exchange.wait_for_candidate()  # every candidate full or rate-limited: wait
    order = await exchange.admit()
    return await attempt_in_order(exchange, client, observation, order)


def parse(exchange: Exchange, body: bytes) -> ClientRequest:
    """The door's reading of the body, the client's identifying fields taken out of what goes upstream
    (request/privacy.py). A body the door refuses gets an observation naming the route it asked for,
    if any, so that its ledger row does."""
    policy = exchange.policy
    try:
        caller = "" if exchange.key is None else exchange.key.digest
        client = exchange.door.parse(body, policy, policy.tuning.chars_per_token, caller)
    except GatewayError:
        route, stream = named_in(body, policy)
        exchange.observation = observation_of(exchange, route, stream=stream)
        raise
    client.identity = take_identity(client.payload)
    return client


async def attempt_in_order(
    exchange: Exchange, client: ClientRequest, observation: Observation, order: tuple[str, ...]
) -> Response | StreamRelay:
    """Try each chosen backend until one answers; fall back only while no byte reached the client."""
    runtime = exchange.runtime
    deadline = exchange.started_at + client.route.fallback.deadline_s
    failure: AttemptFailure | None = None
    for name in order[: client.route.fallback.max_attempts]:
        remaining = deadline - runtime.clock()
        if remaining <= 0:
            break
        if observation.attempts and not runtime.allows(name):
            continue
        backend = exchange.policy.backends[name]
        if failure is not None:  # the answer will say it came from a fallback, and why
            observation.decision_reason = f"fallback_after_{failure.kind}"
        attempt = exchange.begin_attempt(name)
        if client.keys.hashes and exchange.decision is not None:
            observation.predicted_cached_tokens = exchange.decision.cached_tokens.get(name, 0)
        path, body = exchange.door.upstream_path, upstream_body(client, backend)
        try:
            if client.stream:
                wait_s = min(backend.timeouts.first_byte_s, remaining)
                return await open_stream(exchange, attempt, exchange.call(backend, path, body, True, wait_s))
            wait_s = min(backend.timeouts.answer_s, remaining)
            return await complete_once(exchange, attempt, exchange.call(backend, path, body, False, wait_s))
        except AttemptFailure as exc:
            # Kept without its traceback: that holds this frame, whose ``failure`` would hold it back, a
            # reference cycle keeping the request's objects until the collector ran.
            failure = exc.with_traceback(None)
            attempt.status = "timeout" if exc.kind == "timeout" else "upstream_error"
            attempt.error, attempt.http_status = exc.message, exc.http_status
            exchange.end_attempt()
            log.warning(
                "upstream %s failed: %s (status %s, request %s)",
                name,
                exc.kind,
                exc.http_status,
                exchange.request_id,
            )
            if exc.client_fault is not None:
                exchange.fail("upstream_rejected_request")
                raise exc.client_fault from None
            if exc.http_status == 429:
                runtime.rate_limited(name, exc.retry_after)
    if failure is not None and failure.http_status == 429:
        # Backpressure: wait for a free candidate within the route's bound (else 429, never 502).
        order = await exchange.wait_for_candidate()
        return await attempt_in_order(exchange, client, observation, order)
    exchange.fail("upstream_failed")
    raise final_error(failure, len(observation.attempts), runtime.wall_clock())


async def open_stream(exchange: Exchange, attempt: Attempt, call: UpstreamCall) -> StreamRelay:
    """Open the upstream stream and wait for its first event: until then a failure can still fall back."""
    upstream = await exchange.open(call)
    client = exchange.client
    assert client is not None
    meter = StreamMeter(
        attempt,
        client_wants_usage=client.wants_usage,
        prompt_tokens=client.prompt_tokens,
        transcript=transcript_for(exchange),
    )
    first, rest = await first_events(upstream, meter, call, exchange.runtime.clock)
    upstream.expect_chunks_within(call.backend.timeouts.idle_s)
    if meter.final_usage:  # a short stream's usage came in its first read: priced here, not by the relay
        meter.final_usage = False
        cost, basis = exchange.cost_so_far(attempt, meter.usage_so_far())
        first = insert_usage_cost(first, cost, basis)
    headers = response_headers(exchange, "text/event-stream")
    translator = exchange.door.stream_translator(exchange)
    if translator is not None:
        first = translator.translate(first)
    return StreamRelay(
        exchange,
        upstream,
        headers=headers,
        first=first,
        rest=rest,
        meter=meter,
        attempt=attempt,
        translator=translator,
    )


async def complete_once(exchange: Exchange, attempt: Attempt, call: UpstreamCall) -> Response:
    # A whole answer's headers come only once it is complete, so its wait is the answer's, not a token's.
    runtime, client, observation = exchange.runtime, exchange.client, exchange.observation
    assert client is not None and observation is not None
    upstream = await exchange.open(call)
    raw = await upstream.read(
        max(exchange.started_at + client.route.fallback.deadline_s - runtime.clock(), 1.0)
    )
    attempt.finished_at = runtime.clock()
    unusable = unusable_answer(raw)
    if unusable is not None:  # a 200 that is no answer is a failed attempt: fall back
        raise AttemptFailure("upstream_error", f"{call.backend.name}: {unusable}")
    if exchange.trace is not None:  # its trace lets it in only where telemetry.content may
        exchange.trace.answer = raw
    attempt.usage, decode_s = read_completion(
        raw, client.prompt_tokens, exchange.policy.tuning.chars_per_token
    )
    duration = attempt.finished_at - attempt.started_at
    if decode_s is not None:  # llama.cpp says how long decoding took: the rest was waiting for token one
        attempt.decode_s = min(decode_s, duration)
        attempt.ttft_s = duration - attempt.decode_s
    else:  # the backend's usual first-token wait, measured on its streams, was not decoding
        usual_ttft = runtime.stats.ttft_p50_s(call.backend.name) or 0.0
        attempt.decode_s = duration - usual_ttft if usual_ttft < duration else duration
    exchange.end_attempt()
    if observation.cost_usd is not None:  # the answer's usage says what it cost, as OpenRouter's do
        raw = insert_usage_cost(raw, observation.cost_usd, observation.cost_basis)
    reply = Response(exchange.door.render_answer(raw, exchange))
    reply.raw_headers = [*reply.raw_headers, *response_headers(exchange, "application/json")]
    return reply


async def read_body(
    headers: Headers, receive: Receive, limit: int, timeout_s: float, arrived: bool = False
) -> bytes:
    """The whole body, at most ``limit`` bytes, within ``timeout_s`` (unless it ``arrived`` whole with its
    headers): a client that trickles it (or declares more than it sends) is answered 408 and its connection
    closed. Read from the ASGI messages themselves (Starlette's ``Request.stream`` is an async generator)."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {int(declared)} bytes; the limit is {limit}")
    if arrived:  # no wait to bound: an ``asyncio.timeout`` costs ~1.7 us even unarmed (two loop lookups)
        return await read_all(receive, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await read_all(receive, limit)
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {timeout_s:g}s") from None


async def read_all(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def shed(runtime: Runtime, door: Door, scope: Scope, receive: Receive, send: Send) -> None:
    """503 with Retry-After before anything is read or built (``runtime.admission``): no exchange, no
    reservation, no ledger row, so a flood costs the process little more than its connections."""
    server = runtime.policy.server
    refusal = Overloaded(server.max_in_flight, server.shed_retry_after_s)
    runtime.error_returned(refusal)
    await door.error_response(refusal)(scope, receive, send)


def upstream_body(client: ClientRequest, backend: CompiledBackend) -> bytes:
    """The client's body with the backend's model name, shaped as its engine takes it (system messages,
    reasoning knobs: ``backends.chat_shape``, whose notes the answer's headers carry), and the client's
    identity only for a backend allowed it; streams always ask for usage (stripped again by the relay
    when the client did not ask), so every streamed token is accounted for."""
    shaped_payload, client.upstream_notes = shaped(client.payload, backend)
    payload: dict[str, Any] = dict(shaped_payload)
    payload["model"] = backend.model
    with_identity(payload, client.identity, backend)
    with_cache_salt(payload, client.cache_salt, backend)
    if client.stream:
        payload["stream_options"] = {**(client.payload.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(payload)


def final_error(failure: AttemptFailure | None, attempts: int, wall_now: float) -> GatewayError:
    if failure is None:
        return UpstreamTimeout("the route's deadline passed before any backend could be tried")
    tried = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if failure.kind == "timeout":
        return UpstreamTimeout(f"no backend answered in time ({tried}; last: {failure.message})")
    return UpstreamError(
        f"every backend failed ({tried}; last: {failure.message})",
        retry_after=retry_after_header(failure.retry_after, wall_now),
    )


def retry_after_header(upstream_value: str | None, wall_now: float) -> str | None:
    """An upstream's Retry-After as whole seconds: whatever text it sent never reaches a client's header."""
    if not upstream_value:
        return None
    return str(max(1, math.ceil(min(retry_after_seconds(upstream_value, wall_now), 3600.0))))


def request_id(raw_headers: Iterable[tuple[bytes, bytes]], runtime: Runtime) -> str:
    """The client's ``x-request-id`` when it looks like one, so logs can be joined; else a new one.
    Read from the ASGI headers (lower-case names) in one pass: Starlette's ``Headers.get`` raised and
    caught a KeyError for every request that sends none, most of them."""
    given = ""
    for name, value in raw_headers:
        if name == b"x-request-id":
            given = value.decode("latin-1")
            break
    # ASCII letters, digits, - and _ only: it goes back in a response header and into logs.
    if 0 < len(given) <= 64 and given.isascii() and given.replace("-", "").replace("_", "").isalnum():
        return given
    return runtime.new_request_id()
