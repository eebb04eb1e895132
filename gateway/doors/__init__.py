"""Front doors: the API dialects clients speak to the gateway, each translated to and from the one the
request path speaks to upstreams (OpenAI chat/completions).

A ``Door`` parses its client's body into a ``ClientRequest`` (whose ``payload`` is what goes upstream),
renders a whole upstream answer back in its own dialect, translates a stream event by event, and
shapes errors as its clients expect. The OpenAI doors translate nothing, at no cost per chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.policy.compiled import CompiledPolicy

if TYPE_CHECKING:
    from gateway.request.exchange import ClientRequest, Exchange


class StreamTranslator(Protocol):
    """Rewrites one stream: upstream (OpenAI SSE) events in, the door's events out."""

    def translate(self, events: bytes) -> bytes:
        """Complete upstream SSE events (each ending in a blank line) -> bytes for the client."""
        ...

    def error(self, message: str, code: str) -> bytes:
        """The event that tells the client the stream broke off (sent before the response ends)."""
        ...


class Door(Protocol):
    name: str  # what the ledger's ``endpoint`` column says, e.g. "chat", "messages"
    upstream_path: str  # below a backend's base URL, e.g. "/chat/completions"

    def parse(self, body: bytes, policy: CompiledPolicy, chars_per_token: float) -> ClientRequest:
        """The client's request, validated, with the payload to send upstream; InvalidRequest if bad."""
        ...

    def render_answer(self, raw: bytes, exchange: Exchange) -> bytes:
        """A whole upstream answer in the door's dialect."""
        ...

    def stream_translator(self, exchange: Exchange) -> StreamTranslator | None:
        """None when the stream goes through as the upstream sent it."""
        ...

    def error_response(self, error: GatewayError) -> Response:
        """An error in the shape this door's clients (and SDKs) expect."""
        ...
