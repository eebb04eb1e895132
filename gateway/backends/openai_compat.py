"""The client for OpenAI-compatible upstreams (vLLM, SGLang, llama.cpp server, paid APIs).

Calls go over ``gateway.backends.wire`` (HTTP/1.1 on asyncio protocols: a stream's pieces reach the
relay from the network callback, with no task wake-up per token), and so do the plain GETs that
signals and health read (``fetch``). Every failure leaves here as ``AttemptFailure``, every
answer as an ``OpenAICompatUpstream`` handle. Dialect differences that matter for measuring (usage
shapes, reasoning fields) are read in ``gateway.values.dialect``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urljoin

import orjson

from gateway.backends.base import Fetched, Take, UpstreamCall
from gateway.backends.wire import Origin, WireError, WirePool, WireResponse, split_url
from gateway.backends.wire_dial import proxy_from_env
from gateway.errors import AttemptFailure, UpstreamClientError
from gateway.policy.compiled import CompiledBackend

# Statuses that mean "this request is wrong", not "this backend is wrong": passed on, never retried.
CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})
STATUS_BODY_WAIT_S = 5.0  # how long a refusal's body may take to arrive (its message is only a courtesy)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5  # a GET follows this many (vLLM's /metrics answers 307 to /metrics/ on some versions)
GET_HEADERS = {"accept": "*/*", "accept-encoding": "gzip, deflate"}
CONTENT_LENGTH = b"content-length: "  # how a prebuilt POST head ends (wire_origin.Origin.head)


class OpenAICompatUpstream:
    """One answer in flight on a pooled connection."""

    __slots__ = ("_backend", "_limit", "_response")

    def __init__(self, backend: CompiledBackend, response: WireResponse, limit: int) -> None:
        self._backend = backend
        self._response = response
        self._limit = limit  # the most a whole body may be

    async def chunks(self) -> AsyncIterator[bytes]:
        """Bytes as the network delivers them; the read clock bounds each wait."""
        response = self._response
        while True:
            try:
                data = await response.readany()
            except WireError as exc:
                raise self._mid_stream(exc) from None
            if not data:
                return
            yield data

    async def push(self, take: Take) -> bool:
        try:
            return await self._response.push(take)
        except WireError as exc:
            raise self._mid_stream(exc) from None

    def _mid_stream(self, exc: WireError) -> AttemptFailure:
        if exc.kind == "silent":
            return AttemptFailure("timeout", f"{self._backend.name}: stream went silent")
        if exc.kind in ("malformed", "decoding"):
            return AttemptFailure("dropped", f"{self._backend.name}: stream broke off ({exc.detail})")
        return AttemptFailure("dropped", f"{self._backend.name}: stream broke off")

    async def read(self, timeout_s: float) -> bytes:
        response = self._response
        try:
            if response.ended:  # the whole answer came with its head (a short one): no clock to wait on
                return await response.read(self._limit)
            async with asyncio.timeout(timeout_s):
                return await response.read(self._limit)
        except TimeoutError as exc:
            raise AttemptFailure("timeout", f"{self._backend.name}: response body timed out") from exc
        except WireError as exc:
            if exc.kind in ("malformed", "decoding"):  # the upstream's answer is wrong, not lost
                raise AttemptFailure("upstream_error", f"{self._backend.name}: {exc.detail}") from exc
            raise AttemptFailure("dropped", f"{self._backend.name}: connection lost while reading") from exc

    def expect_chunks_within(self, idle_s: float) -> None:
        self._response.read_within(idle_s)

    def close(self) -> None:
        # Read to its end: the connection goes back to the pool; cut: the upstream sees its client
        # leave and frees the slot.
        self._response.close()


# Per backend: its origin (TLS, proxy), the request heads by path, the first-read clock of a stream,
# connect clock, connection cap.
class _Prepared:
    __slots__ = ("backend", "connect_s", "first_read_s", "headers", "heads", "max_connections", "origin")

    def __init__(self, backend: CompiledBackend, environ: Mapping[str, str]) -> None:
        self.backend = backend
        self.origin = origin_of(backend, environ)
        self.max_connections = backend.max_connections
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "accept-encoding": "gzip, deflate",
        }
        if backend.api_key:
            headers["authorization"] = f"Bearer {backend.api_key}"
        self.headers = headers
        self.heads: dict[str, bytes] = {}
        timeouts = backend.timeouts
        self.first_read_s = max(timeouts.first_byte_s, timeouts.idle_s)
        self.connect_s = timeouts.connect_s

    def head(self, path: str) -> bytes:
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = self.origin.head(path, self.headers)
        return head

    def traced_head(self, call: UpstreamCall) -> bytes:
        """The path's head with the call's own header lines before its closing content-length."""
        head = self.head(call.path)
        return head[: -len(CONTENT_LENGTH)] + call.trace_headers + CONTENT_LENGTH


def origin_of(backend: CompiledBackend, environ: Mapping[str, str]) -> Origin:
    """Where a backend's calls go: with its TLS context, through the environment's proxy unless the
    backend says not to (``trust_env``) or NO_PROXY covers its host."""
    origin = Origin.of(backend.base_url)
    if backend.trust_env:
        origin = with_proxy(origin, environ)
    return replace(origin, tls=backend.tls) if backend.tls is not None else origin


def with_proxy(origin: Origin, environ: Mapping[str, str]) -> Origin:
    proxy = proxy_from_env(origin.scheme, origin.host, environ) if environ else None
    return origin if proxy is None else replace(origin, proxy=proxy)


class OpenAICompatClient:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._wire = WirePool()
        self._prepared_for: dict[str, _Prepared] = {}
        # Proxies come from the environment as the process started (or as a test gives it).
        self._environ = dict(os.environ if environ is None else environ)

    async def close(self) -> None:
        self._wire.close()

    async def open(self, call: UpstreamCall) -> OpenAICompatUpstream:
        """POST the call and return once its head arrived with status 200.

        Within a stream the socket may then stay silent up to the backend's ``first_byte_s`` until
        the relay tightens that to ``idle_s`` with ``expect_chunks_within``.
        """
        backend = call.backend
        prepared = self._prepared(backend)
        try:
            async with asyncio.timeout(call.wait_s):
                response = await self._wire.post(
                    prepared.origin,
                    prepared.head(call.path) if not call.trace_headers else prepared.traced_head(call),
                    call.body,
                    prepared.connect_s,
                    prepared.max_connections,
                )
        except TimeoutError as exc:
            raise AttemptFailure("timeout", f"{backend.name}: no response in {call.wait_s:g}s") from exc
        except WireError as exc:
            if exc.kind == "connect":
                raise AttemptFailure(
                    "connect_error", f"{backend.name}: cannot connect: {exc.detail}"
                ) from exc
            raise AttemptFailure("upstream_error", f"{backend.name}: {_named(exc)}: {exc.detail}") from exc
        if response.status != 200:
            raise await _failure_from_status(backend, response, self._wire.limits.body_bytes)
        if call.stream:
            response.read_within(prepared.first_read_s)
        return OpenAICompatUpstream(backend, response, self._wire.limits.body_bytes)

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | None,
        timeout_s: float,
        backend: CompiledBackend | None = None,
    ) -> Fetched:
        """GET ``url`` (following redirects) within ``timeout_s``: its status and text, or what failed.
        ``backend``: whose TLS context and proxy setting (``trust_env``) apply on its URL's origin.

        A redirect to another origin drops the caller's headers (the backend's ``Authorization``
        among them), as browsers, httpx and requests do; one from https to http is refused."""
        sent = GET_HEADERS if not headers else {**GET_HEADERS, **headers}
        try:
            async with asyncio.timeout(timeout_s):
                first: Origin | None = None
                for _ in range(MAX_REDIRECTS + 1):
                    origin, target = split_url(url)
                    if first is None:
                        first = origin
                    elif origin != first:
                        if first.scheme == "https" and origin.scheme == "http":
                            return Fetched(None, error=f"InsecureRedirect: https to {origin.name} refused")
                        sent = GET_HEADERS
                    origin = self._reached(origin, backend if origin == first else None)
                    response = await self._wire.get(origin, origin.get_head(target, sent), None)
                    try:
                        body = await response.read(self._wire.limits.body_bytes)
                    finally:
                        response.close()
                    location = response.header(b"location")
                    if response.status not in REDIRECT_STATUSES or not location:
                        return Fetched(response.status, body.decode(_charset(response), "replace"))
                    url = urljoin(url, location)
                return Fetched(None, error=f"TooManyRedirects: more than {MAX_REDIRECTS}")
        except TimeoutError:
            return Fetched(None, error=f"TimeoutError: no answer in {timeout_s:g}s")
        except WireError as exc:
            if exc.kind == "connect":
                return Fetched(None, error=f"ConnectError: {exc.detail}")
            return Fetched(None, error=f"{_named(exc)}: {exc}")
        except ValueError as exc:  # not an http(s) URL (a redirect elsewhere, say)
            return Fetched(None, error=f"InvalidURL: {exc}")

    def _reached(self, origin: Origin, backend: CompiledBackend | None) -> Origin:
        """``origin`` with the proxy and TLS context a GET to it takes."""
        if backend is None or backend.trust_env:
            origin = with_proxy(origin, self._environ)
        if backend is not None and backend.tls is not None:
            origin = replace(origin, tls=backend.tls)
        return origin

    def _prepared(self, backend: CompiledBackend) -> _Prepared:
        """Origin, heads and clocks of a backend, built once per compiled backend, not once per request."""
        known = self._prepared_for.get(backend.name)
        if known is not None and known.backend is backend:
            return known
        prepared = self._prepared_for[backend.name] = _Prepared(backend, self._environ)
        return prepared


def _charset(response: WireResponse) -> str:
    for param in (response.header(b"content-type") or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"')
            try:
                "".encode(charset)
            except LookupError:
                break
            return charset
    return "utf-8"


def _named(exc: WireError) -> str:
    """What went wrong on the wire, in a word: ``ServerDisconnected`` or ``MalformedResponse`` before
    the head, ``ConnectionLost`` in a GET's body."""
    names = {
        "disconnected": "ServerDisconnected",
        "malformed": "MalformedResponse",
        "broken": "ConnectionLost",
        "decoding": "DecodingError",
    }
    return names.get(exc.kind, exc.kind)


async def _failure_from_status(
    backend: CompiledBackend, response: WireResponse, limit: int
) -> AttemptFailure:
    status = response.status
    try:
        async with asyncio.timeout(STATUS_BODY_WAIT_S):
            raw = await response.read(limit)
    except (TimeoutError, WireError):
        raw = b""
    finally:
        response.close()
    message, code, param = _error_fields(raw)
    if status in CLIENT_FAULT_STATUSES:
        fault = UpstreamClientError(
            status, message or f"upstream refused the request ({status})", code, param
        )
        return AttemptFailure("client_error", message, http_status=status, client_fault=fault)
    return AttemptFailure(
        "upstream_error",
        f"{backend.name}: HTTP {status}",
        http_status=status,
        retry_after=response.header(b"retry-after"),
    )


def _error_fields(raw: bytes) -> tuple[str, str | None, str | None]:
    try:
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace"), None, None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(parsed, dict) and error is None and isinstance(parsed.get("message"), str):
        error = parsed  # SGLang's errors are flat: {"object": "error", "message", "type", "param", "code"}
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message", ""))
        if _context_length_exceeded(error.get("type"), message):
            code = "context_length_exceeded"  # the OpenAI code, whatever the engine calls it
        return message, None if code is None else str(code), error.get("param")
    if isinstance(error, str):
        return error, None, None
    return str(parsed)[:200], None, None


# How each engine says a prompt is past its context (docs/contracts/*.yaml, limits.context_length): none
# sends OpenAI's "context_length_exceeded" code.
_CONTEXT_MESSAGES = (
    "maximum context length",
    "longer than the model's context length",
    "exceeds the available context size",
)


def _context_length_exceeded(kind: object, message: str) -> bool:
    return kind == "exceed_context_size_error" or any(words in message for words in _CONTEXT_MESSAGES)
