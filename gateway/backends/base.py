"""The backend seam: what the request path asks of any kind of upstream, and nothing more.

A ``BackendClient`` opens one call (``UpstreamCall``) and hands back an ``Upstream``: a small handle
that yields the answer's bytes (``chunks``), hands them to a callback as they arrive (``push``) or
reads it whole (``read``) and is closed exactly once
(``close``: the connection is reused when the answer was read to its end, cut otherwise, which is
what frees the upstream's slot). Failures leave a client only as ``AttemptFailure``. The same client
also fetches the plain GET pages that signals and health read (``fetch``), so a process has one
HTTP stack for upstream traffic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.policy.compiled import CompiledBackend

# Takes one piece of a body; False: stop handing pieces over for now (the caller has work to await).
Take = Callable[[bytes], bool]


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One request to one backend: where, what, and how long to wait for its answer to start."""

    backend: CompiledBackend
    path: str  # below the backend's base URL, e.g. "/chat/completions"
    body: bytes
    stream: bool
    # The wait for the answer's head: a stream's comes with its first token at the latest,
    # a whole answer's only once it is complete.
    wait_s: float
    # Header lines (each ending CRLF) for this call alone: the W3C trace context (gateway/telemetry).
    trace_headers: bytes = b""


@dataclass(frozen=True, slots=True)
class Fetched:
    """The answer to a GET (metrics, slots, health): ``status`` None when none came."""

    status: int | None
    text: str = ""
    error: str = ""


class Upstream(Protocol):
    """An answer that started arriving with status 200."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as the network delivers them (a stream's SSE events, in any cut)."""
        ...

    async def push(self, take: Take) -> bool:
        """Hand the body's next pieces to ``take`` as they arrive, until it returns False (then False)
        or the body has ended (then True). Where the client can, ``take`` runs in the network callback
        itself, so a relay waits once per stream instead of once per token. Fails as ``chunks`` does."""
        ...

    async def read(self, timeout_s: float) -> bytes:
        """The whole body (a non-streamed answer)."""
        ...

    def expect_chunks_within(self, idle_s: float) -> None:
        """From now on, silence longer than ``idle_s`` between chunks is a timeout."""
        ...

    def close(self) -> None:
        """Give the connection back when the answer was read to its end; cut it otherwise. Idempotent."""
        ...


class BackendClient(Protocol):
    async def open(self, call: UpstreamCall) -> Upstream:
        """Send ``call``; return once the answer's head arrived with status 200, else AttemptFailure."""
        ...

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | None,
        timeout_s: float,
        backend: CompiledBackend | None = None,
    ) -> Fetched:
        """GET ``url`` (reached as ``backend`` says: its TLS, its proxy setting); never raises for the
        server's fault."""
        ...

    async def close(self) -> None: ...
