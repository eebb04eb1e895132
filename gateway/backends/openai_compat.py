"""The client for OpenAI-compatible upstreams (vLLM, SGLang, llama.cpp server, paid APIs): aiohttp.

It owns the pooled aiohttp session and is the one place aiohttp objects and exceptions exist: every
failure leaves here as ``AttemptFailure``, every answer as an ``OpenAICompatUpstream`` handle.
Dialect differences that matter for measuring (usage shapes, reasoning fields) are read in
``gateway.request.dialect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from gateway.backends.base import Fetched, UpstreamCall
from gateway.errors import AttemptFailure, UpstreamClientError
from gateway.policy.compiled import CompiledBackend

# Per backend: request headers, the timeout of a stream, the timeout of a whole answer.
Prepared = tuple[dict[str, str], aiohttp.ClientTimeout, aiohttp.ClientTimeout]
# Statuses that mean "this request is wrong", not "this backend is wrong": passed on, never retried.
CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})


class OpenAICompatUpstream:
    """One answer in flight on a pooled connection."""

    __slots__ = ("_backend", "_closed", "_response")

    def __init__(self, backend: CompiledBackend, response: aiohttp.ClientResponse) -> None:
        self._backend = backend
        self._response = response
        self._closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """Bytes as the network delivers them; the socket's read timeout bounds each wait."""
        content = self._response.content
        try:
            while True:
                data = await content.readany()
                if not data:
                    return
                yield data
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one
            raise AttemptFailure("timeout", f"{self._backend.name}: stream went silent") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AttemptFailure("dropped", f"{self._backend.name}: stream broke off") from exc

    async def read(self, timeout_s: float) -> bytes:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._response.read()
        except TimeoutError as exc:
            raise AttemptFailure("timeout", f"{self._backend.name}: response body timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AttemptFailure("dropped", f"{self._backend.name}: connection lost while reading") from exc

    def expect_chunks_within(self, idle_s: float) -> None:
        """aiohttp re-arms its read timer on every packet anyway; setting it here costs nothing per
        chunk, where an ``asyncio.timeout`` around each read would cost a timer and a context."""
        connection = self._response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = idle_s
            connection.protocol.start_timeout()  # re-arm now: the running timer was for the first byte

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        response = self._response
        if response.content.is_eof():
            response.release()  # read to its end: the connection goes back to the pool
        else:
            response.close()  # cut: the upstream sees its client leave and frees the slot


class OpenAICompatClient:
    def __init__(self, *, max_connections: int = 0) -> None:
        # limit=0: no pool-wide cap; each backend's max_concurrency is enforced by the decision.
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            json_serialize=lambda o: orjson.dumps(o).decode(),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
        )
        self._prepared_for: dict[str, tuple[CompiledBackend, Prepared]] = {}

    async def close(self) -> None:
        await self._session.close()

    async def open(self, call: UpstreamCall) -> OpenAICompatUpstream:
        """POST the call and return once its headers arrived with status 200.

        Within a stream the socket may then stay silent up to the backend's ``first_byte_s`` until
        the relay tightens that to ``idle_s`` with ``expect_chunks_within``.
        """
        backend = call.backend
        headers, stream_timeout, whole_timeout = self._prepared(backend)
        timeout = stream_timeout if call.stream else whole_timeout
        try:
            async with asyncio.timeout(call.wait_s):
                response = await self._session.post(
                    backend.base_url + call.path, data=call.body, headers=headers, timeout=timeout
                )
        except TimeoutError as exc:
            raise AttemptFailure("timeout", f"{backend.name}: no response in {call.wait_s:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise AttemptFailure("connect_error", f"{backend.name}: cannot connect") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AttemptFailure("upstream_error", f"{backend.name}: {type(exc).__name__}") from exc
        if response.status != 200:
            raise await _failure_from_status(backend, response)
        return OpenAICompatUpstream(backend, response)

    async def fetch(self, url: str, headers: dict[str, str] | None, timeout_s: float) -> Fetched:
        try:
            async with self._session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                return Fetched(response.status, await response.text(errors="replace"))
        except aiohttp.ClientConnectorError:
            return Fetched(None, error="ConnectError: cannot connect")  # aiohttp's text names the address
        except (TimeoutError, aiohttp.ClientError, OSError, UnicodeError) as exc:
            # Timeouts often carry no message: the exception's name is the useful part.
            return Fetched(None, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    def _prepared(self, backend: CompiledBackend) -> Prepared:
        """Headers and timeouts of a backend, built once per compiled backend, not once per request."""
        known = self._prepared_for.get(backend.name)
        if known is not None and known[0] is backend:
            return known[1]
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if backend.api_key:
            headers["authorization"] = f"Bearer {backend.api_key}"
        timeouts = backend.timeouts
        first_read_s = max(timeouts.first_byte_s, timeouts.idle_s)
        prepared = (
            headers,
            aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=first_read_s),
            aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s),
        )
        self._prepared_for[backend.name] = (backend, prepared)
        return prepared


async def _failure_from_status(backend: CompiledBackend, response: aiohttp.ClientResponse) -> AttemptFailure:
    status = response.status
    try:
        raw = await asyncio.wait_for(response.read(), timeout=5.0)
    except (TimeoutError, aiohttp.ClientError, OSError):
        raw = b""
    finally:
        response.release()
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
        retry_after=response.headers.get("retry-after"),
    )


def _error_fields(raw: bytes) -> tuple[str, str | None, str | None]:
    try:
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace"), None, None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        return str(error.get("message", "")), None if code is None else str(code), error.get("param")
    if isinstance(error, str):
        return error, None, None
    return str(parsed)[:200], None, None
