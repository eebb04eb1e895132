"""Front doors: the API dialects clients speak to the gateway, each translated to and from the one the
request path speaks to upstreams (OpenAI chat/completions).

A ``Door`` parses its client's body into a ``ClientRequest`` (whose ``payload`` is what goes upstream),
renders a whole upstream answer back in its own dialect, translates a stream event by event, and
shapes errors as its clients expect. The OpenAI doors translate nothing, at no cost per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.measure.prefix_index import NO_KEYS, PromptKeys
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.values.observation import Observation


@dataclass(slots=True)
class ClientRequest:
    """What the client asked for, parsed once."""

    payload: dict[str, Any]
    route: CompiledRoute
    stream: bool
    wants_usage: bool
    prompt_chars: int
    prompt_tokens: int  # estimated from its characters, before any upstream counted them
    max_tokens: int | None
    # The client's identifying fields, taken out of ``payload`` (request/privacy.py): they go upstream
    # only to a backend with ``forward_user: true``.
    identity: dict[str, Any] = field(default_factory=dict)
    # What the door left out or changed (a hosted tool dropped, say), said in ``x-gateway-notes``;
    # the backend's own notes (``backends.chat_shape``) are those of the attempt that answered.
    notes: tuple[str, ...] = ()
    upstream_notes: tuple[str, ...] = ()
    cache_key: str | None = None  # the client's prompt-cache key (Responses ``prompt_cache_key``)
    keys: PromptKeys = NO_KEYS  # the prompt's keys for the prefix index (request/cache_keys.py)
    # The engines' cache_salt for the request's cache scope (policy/cache_scope.py); None: shared.
    cache_salt: str | None = None
    door_state: Any = None  # what the door needs again to answer in its dialect (its own type)


class Answering(Protocol):
    """What a door reads of the request it answers (the request path's ``Exchange``): the doors sit
    below the request path and never import it."""

    @property
    def client(self) -> ClientRequest | None: ...

    @property
    def request_id(self) -> str: ...

    @property
    def policy(self) -> CompiledPolicy: ...

    @property
    def observation(self) -> Observation | None: ...


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

    def parse(
        self, body: bytes, policy: CompiledPolicy, chars_per_token: float, caller: str = ""
    ) -> ClientRequest:
        """The client's request, validated, with the payload to send upstream; InvalidRequest if bad.
        ``caller`` names the caller's API key (its digest; ``""`` without keys), for what a door binds
        to it (the Responses door's sealed reasoning)."""
        ...

    def render_answer(self, raw: bytes, exchange: Answering) -> bytes:
        """A whole upstream answer in the door's dialect."""
        ...

    def stream_translator(self, exchange: Answering) -> StreamTranslator | None:
        """None when the stream goes through as the upstream sent it."""
        ...

    def error_response(self, error: GatewayError) -> Response:
        """An error in the shape this door's clients (and SDKs) expect."""
        ...
