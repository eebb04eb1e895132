"""A request's keys for the prefix index (``gateway.measure.prefix_index``), computed once when it is
parsed: the prompt's prefix hashes as the upstream will see it (the door's chat payload), and the
client's own conversation key where it sends one. Codex sends ``prompt_cache_key`` (and a
``session-id`` header); Claude Code sends its session id inside ``metadata.user_id`` (a JSON string,
tests/clients/fixtures/claude_code_first_turn.json, read by the Messages door); other agents send a
session header.
"""

from __future__ import annotations

from gateway.doors import ClientRequest
from gateway.measure.prefix_index import NO_KEYS, PromptKeys, prompt_keys

SESSION_HEADERS = frozenset((b"session-id", b"x-session-id", b"x-claude-code-session-id"))
MAX_KEY_CHARS = 128  # a client key longer than this is cut: it names a conversation, nothing more
# A prompt shorter than this is not keyed: its cache would save next to nothing (the paid APIs cache
# nothing under 1,024 tokens; a pool prefills it in a few milliseconds), so short requests pay nothing
# for the index.
MIN_KEYED_TOKENS = 1024


def keys_for(
    client: ClientRequest, raw_headers: list[tuple[bytes, bytes]], chars_per_token: float
) -> PromptKeys:
    if client.prompt_tokens < MIN_KEYED_TOKENS:
        return NO_KEYS
    return prompt_keys(client.payload, client.prompt_chars, chars_per_token, client_key(client, raw_headers))


def client_key(client: ClientRequest, raw_headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's name for its conversation: the door's (Responses ``prompt_cache_key``, Claude Code's
    session id in its ``metadata.user_id``, read by the Messages door), chat's ``prompt_cache_key``
    (taken out of the payload with the client's identity), or a session header."""
    key = client.cache_key
    if key is None and client.identity:
        given = client.identity.get("prompt_cache_key")
        key = given if isinstance(given, str) and given else None
    if key is None:
        key = next((v.decode("latin-1") for k, v in raw_headers if k in SESSION_HEADERS and v), None)
    return None if key is None else key[:MAX_KEY_CHARS]
