"""The client for native provider APIs (``dialect: litellm``): litellm's SDK translates our chat payload
to the provider's API (Anthropic Messages, Gemini, Bedrock, ...) and its answer back.

The answer leaves here as OpenAI chat-completions bytes (SSE events for a stream, JSON for a whole
answer) through the same ``Upstream`` handle as any backend, so the relay and the meter do not change.
litellm is imported here (and its price map in policy/prices.py, whose ``import_litellm`` both use);
every litellm exception leaves as ``AttemptFailure``: 429 and 5xx fall back to the next backend, other
4xx are the client's to fix.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.backends.base import Fetched, Take, UpstreamCall
from gateway.errors import AttemptFailure, UpstreamClientError
from gateway.policy.compiled import CompiledBackend
from gateway.policy.prices import import_litellm

# Our payload's fields that are the gateway's business, not the provider's.
OWN_FIELDS = ("model", "stream")


class LitellmUpstream:
    """One answer from litellm: a stream wrapper (re-emitted as SSE events) or a whole response."""

    __slots__ = ("_backend", "_idle_s", "_whole", "_wrapper")

    def __init__(self, backend: CompiledBackend, wrapper: Any = None, whole: bytes = b"") -> None:
        self._backend = backend
        self._wrapper = wrapper
        self._whole = whole
        self._idle_s: float | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        stream = self._wrapper.__aiter__()
        while True:
            try:
                if self._idle_s is None:
                    chunk = await anext(stream)
                else:
                    async with asyncio.timeout(self._idle_s):
                        chunk = await anext(stream)
            except StopAsyncIteration:
                yield b"data: [DONE]\n\n"
                return
            except TimeoutError:
                raise AttemptFailure("timeout", f"{self._backend.name}: stream went silent") from None
            except Exception as exc:
                raise failure_of(self._backend, exc, mid_stream=True) from None
            yield b"data: " + chunk.model_dump_json(exclude_none=True).encode() + b"\n\n"

    async def push(self, take: Take) -> bool:
        # litellm's iterator wakes a task per chunk anyway: pulled here, for the same interface.
        async for data in self.chunks():
            if not take(data):
                return False
        return True

    async def read(self, timeout_s: float) -> bytes:
        return self._whole

    def expect_chunks_within(self, idle_s: float) -> None:
        self._idle_s = idle_s

    def close(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        stream = getattr(wrapper, "completion_stream", None)
        closer = getattr(stream, "aclose", None)
        if closer is not None:  # cut the provider's connection when the client left early
            task = asyncio.get_running_loop().create_task(closer())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


class LitellmClient:
    def __init__(self) -> None:
        self._litellm = import_litellm()

    async def open(self, call: UpstreamCall) -> LitellmUpstream:
        backend = call.backend
        payload = orjson.loads(call.body)
        arguments = {k: v for k, v in payload.items() if k not in OWN_FIELDS}
        arguments.update(model=backend.model, stream=call.stream, drop_params=True, num_retries=0)
        arguments.update(api_base=backend.base_url, timeout=backend.timeouts.answer_s)
        if backend.api_key:
            arguments["api_key"] = backend.api_key
        try:
            async with asyncio.timeout(call.wait_s):
                answer = await self._litellm.acompletion(**arguments)
        except TimeoutError:
            raise AttemptFailure("timeout", f"{backend.name}: no response in {call.wait_s:g}s") from None
        except Exception as exc:
            raise failure_of(backend, exc) from None
        if call.stream:
            return LitellmUpstream(backend, wrapper=answer)
        return LitellmUpstream(backend, whole=answer.model_dump_json(exclude_none=True).encode())

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | None,
        timeout_s: float,
        backend: CompiledBackend | None = None,
    ) -> Fetched:
        return Fetched(None, error="litellm backends are not scraped")

    async def close(self) -> None:
        return None


def failure_of(backend: CompiledBackend, exc: Exception, *, mid_stream: bool = False) -> AttemptFailure:
    """litellm's exception as our failure: 408, 429, 5xx and no status fall back, other 4xx do not."""
    status = getattr(exc, "status_code", None)
    message = str(getattr(exc, "message", None) or exc)[:500]
    kind = "dropped" if mid_stream else "upstream_error"
    if "Timeout" in type(exc).__name__:
        return AttemptFailure("timeout", f"{backend.name}: timed out", http_status=status)
    if "Connection" in type(exc).__name__ and not isinstance(status, int):
        return AttemptFailure("connect_error", f"{backend.name}: cannot connect")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429) and not mid_stream:
        fault = UpstreamClientError(status, message)
        return AttemptFailure("client_error", message, http_status=status, client_fault=fault)
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    retry_after = headers.get("retry-after") if hasattr(headers, "get") else None
    return AttemptFailure(
        kind, f"{backend.name}: HTTP {status or 'error'}", http_status=status, retry_after=retry_after
    )
