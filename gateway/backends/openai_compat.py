"""The adapter for OpenAI-compatible upstreams (vLLM, llama.cpp server, paid APIs): aiohttp on the hot path.

It owns the pooled aiohttp session and is the one place aiohttp exceptions exist: every failure
leaves here as ``AttemptFailure``. Dialect differences that matter for measuring (usage shapes,
reasoning field names) are read in ``gateway.dialect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from gateway.errors import AttemptFailure, UpstreamClientError
from gateway.policy.compiled import CompiledBackend

# Statuses that mean "this request is wrong", not "this backend is wrong": passed on, never retried.
CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})


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

    async def close(self) -> None:
        await self._session.close()

    async def open(
        self, backend: CompiledBackend, path: str, body: bytes, *, first_byte_s: float
    ) -> aiohttp.ClientResponse:
        """POST ``body`` to ``backend`` and return the response once headers arrived with status 200."""
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if backend.api_key:
            headers["authorization"] = f"Bearer {backend.api_key}"
        url = backend.base_url + path
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=backend.timeouts.connect_s)
        try:
            async with asyncio.timeout(first_byte_s):
                response = await self._session.post(url, data=body, headers=headers, timeout=timeout)
        except TimeoutError as exc:
            raise AttemptFailure("timeout", f"{backend.name}: no response in {first_byte_s:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise AttemptFailure("connect_error", f"{backend.name}: cannot connect") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise AttemptFailure("upstream_error", f"{backend.name}: {type(exc).__name__}") from exc
        if response.status != 200:
            raise await _failure_from_status(backend, response)
        return response

    async def probe(self, backend: CompiledBackend, timeout_s: float = 2.0) -> str:
        """One reachability check: "ok", "booting" (503, e.g. loading weights) or "unreachable"."""
        url = backend.signals.health_url or backend.base_url + "/models"
        headers = {"authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            async with self._session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status == 200:
                    return "ok"
                return "booting" if r.status == 503 else f"http_{r.status}"
        except (TimeoutError, aiohttp.ClientError, OSError):
            return "unreachable"

    async def read_body(
        self, backend: CompiledBackend, response: aiohttp.ClientResponse, timeout_s: float
    ) -> bytes:
        try:
            async with asyncio.timeout(timeout_s):
                return await response.read()
        except TimeoutError as exc:
            response.close()
            raise AttemptFailure("timeout", f"{backend.name}: response body timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            response.close()
            raise AttemptFailure("dropped", f"{backend.name}: connection lost while reading") from exc


async def iter_chunks(
    backend: CompiledBackend, response: aiohttp.ClientResponse, idle_s: float
) -> AsyncIterator[bytes]:
    """Yield bytes as the network delivers them; silence longer than ``idle_s`` is a timeout."""
    content = response.content
    try:
        while True:
            async with asyncio.timeout(idle_s):
                data = await content.readany()
            if not data:
                return
            yield data
    except TimeoutError as exc:
        raise AttemptFailure("timeout", f"{backend.name}: stream idle for {idle_s:g}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise AttemptFailure("dropped", f"{backend.name}: stream broke off") from exc


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
