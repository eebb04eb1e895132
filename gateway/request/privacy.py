"""What of a client's identity may leave for an upstream, and what the ledger keeps of it.

Clients send metadata that names a person, a device or a session: OpenAI's ``user``,
``safety_identifier``, ``metadata`` and ``prompt_cache_key`` (which OpenAI documents as the replacement
for ``user``), Codex's ``client_metadata``, Anthropic's ``metadata.user_id`` (whose user part the
Anthropic door hands on as ``user``, its session id kept as the conversation's cache key:
``doors/anthropic_identity.py``). Whatever door a request came through, these fields are
taken out of its payload once it is parsed (``take_identity``) and go back only into the body of a
backend whose policy says ``forward_user: true`` (``with_identity``): no upstream, and so no paid API,
learns who asked unless the policy says it may. The ledger keeps, when ``ledger.user: hashed``, a keyed
hash of the user's id (``user_hash``): per-user spend without the id itself.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from gateway.policy.compiled import CompiledBackend

# The top-level request fields that identify whoever sent it, in every dialect the doors produce.
IDENTITY_FIELDS = ("user", "safety_identifier", "metadata", "client_metadata", "prompt_cache_key")
USER_HASH_HEX = 32  # 128 bits of HMAC-SHA256: no collision among any real number of users


def take_identity(payload: dict[str, Any]) -> dict[str, Any]:
    """Remove the identifying fields from ``payload`` and return them (an empty dict, almost always)."""
    if payload.keys().isdisjoint(IDENTITY_FIELDS):
        return {}
    return {name: payload.pop(name) for name in IDENTITY_FIELDS if name in payload}


def with_identity(payload: dict[str, Any], identity: dict[str, Any], backend: CompiledBackend) -> None:
    """Put the client's identifying fields back into an upstream body, for a backend allowed them."""
    if identity and backend.forward_user:
        payload.update(identity)


def user_id(identity: dict[str, Any]) -> str | None:
    """The id that names the user: ``user``, else ``safety_identifier``, else ``metadata.user_id``."""
    for value in (identity.get("user"), identity.get("safety_identifier")):
        if isinstance(value, str) and value:
            return value
    metadata = identity.get("metadata")
    value = metadata.get("user_id") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


def user_hash(identity: dict[str, Any], key: bytes | None) -> str | None:
    """The ledger's keyed hash of the user's id; None without a key or an id. Keyed, so that a
    ledger read elsewhere cannot be matched against a list of guessed ids."""
    if key is None:
        return None
    user = user_id(identity)
    if user is None:
        return None
    return hmac.new(key, user.encode(), hashlib.sha256).hexdigest()[:USER_HASH_HEX]
