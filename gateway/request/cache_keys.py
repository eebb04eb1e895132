"""A request's keys for the prefix index (``gateway.measure.prefix_index``), computed once when it is
parsed: the prompt's prefix hashes as the upstream will see it (the door's chat payload), and the
client's own conversation key where it sends one. Codex sends ``prompt_cache_key`` (and a
``session-id`` header); Claude Code sends its session id inside ``metadata.user_id`` (a JSON string,
tests/clients/fixtures/claude_code_first_turn.json); other agents send a session header.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.measure.prefix_index import PromptKeys, prompt_keys
from gateway.request.exchange import ClientRequest

SESSION_HEADERS = frozenset((b"session-id", b"x-session-id", b"x-claude-code-session-id"))
MAX_KEY_CHARS = 128  # a client key longer than this is cut: it names a conversation, nothing more


def keys_for(
    client: ClientRequest, raw_headers: list[tuple[bytes, bytes]], chars_per_token: float
) -> PromptKeys:
    return prompt_keys(client.payload, client.prompt_chars, chars_per_token, client_key(client, raw_headers))


def client_key(client: ClientRequest, raw_headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's name for its conversation: ``prompt_cache_key`` (Responses, or chat completions
    passing it on), a session header, or Claude Code's session id in its metadata."""
    key = client.cache_key
    if key is None:
        given = client.payload.get("prompt_cache_key")
        key = given if isinstance(given, str) and given else None
    if key is None:
        key = next((v.decode("latin-1") for k, v in raw_headers if k in SESSION_HEADERS and v), None)
    if key is None and client.identity:
        key = _metadata_session(client.identity.get("metadata"))
    return None if key is None else key[:MAX_KEY_CHARS]


def _metadata_session(metadata: Any) -> str | None:
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str) or not user_id.startswith("{"):
        return None
    try:
        parsed = orjson.loads(user_id)
    except orjson.JSONDecodeError:
        return None
    session = parsed.get("session_id") if isinstance(parsed, dict) else None
    return session if isinstance(session, str) and session else None
