"""A request's cache scope and its keys for the prefix index (``gateway.measure.prefix_index``),
computed once when it is parsed: the scope (policy/cache_scope.py: whose prompts it may find cached)
puts its salt on the request for the engines that take one, and seeds the prompt's prefix hashes as
the upstream will see the prompt (the door's chat payload); the client's own conversation key, where
it sends one, is scoped alike. Codex sends ``prompt_cache_key`` (and a ``session-id`` header); Claude
Code sends its session id inside ``metadata.user_id`` (a JSON string,
tests/clients/fixtures/claude_code_first_turn.json, read by the Messages door); other agents send a
session header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.backends.chat_shape import SALTED_DIALECTS, with_cache_salt
from gateway.doors import ClientRequest
from gateway.measure.prefix_index import NO_KEYS, KeyCarry, PromptKeys, prompt_keys
from gateway.policy.cache_scope import FLEET

if TYPE_CHECKING:
    from gateway.policy.compiled import CompiledPolicy
    from gateway.values.auth import ApiKey

SESSION_HEADERS = frozenset((b"session-id", b"x-session-id", b"x-claude-code-session-id"))
MAX_KEY_CHARS = 128  # a client key longer than this is cut: it names a conversation, nothing more
# A prompt shorter than this is not keyed: its cache would save next to nothing (the paid APIs cache
# nothing under 1,024 tokens; a pool prefills it in a few milliseconds), so short requests pay nothing
# for the index.
MIN_KEYED_TOKENS = 1024
__all__ = ["SALTED_DIALECTS", "client_key", "keys_for", "scoped_client_key", "with_cache_salt"]


def keys_for(
    client: ClientRequest,
    raw_headers: list[tuple[bytes, bytes]],
    policy: CompiledPolicy,
    key: ApiKey | None,
    carry: KeyCarry | None = None,
) -> PromptKeys:
    """The prompt's keys in the request's cache scope; sets ``client.cache_salt`` to the scope's salt
    (every request, however short: an engine caches a short prompt's blocks too)."""
    scope = FLEET if key is None else policy.cache_scopes.scope(client.route.name, key.name)
    client.cache_salt = scope.salt
    if client.prompt_tokens < MIN_KEYED_TOKENS:
        return NO_KEYS
    conversation = client_key(client, raw_headers)
    if conversation is not None and scope.seed:
        conversation = scoped_client_key(scope.seed, conversation)
    chars_per_token = policy.tuning.chars_per_token
    return prompt_keys(client.payload, client.prompt_chars, chars_per_token, conversation, scope.seed, carry)


def scoped_client_key(seed: int, key: str) -> str:
    """A client's conversation key within a scope: another scope's client naming the same
    conversation (a guessed or leaked session id) finds nothing of it. The seed, not the key's name,
    is what the shared store then holds."""
    return f"{seed:016x}:{key}"


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
