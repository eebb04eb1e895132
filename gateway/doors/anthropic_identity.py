"""Claude Code's ``metadata.user_id``: who asks, and in which session. Claude Code 2.x sends a JSON
string, ``{"device_id": ..., "account_uuid": ..., "session_id": ...}``
(tests/clients/fixtures/claude_code_first_turn.json); 1.x sent ``user_<hash>_account_<uuid>_session_<uuid>``.

The two parts go two ways: the session id names the conversation for the prefix index (cache-aware
routing keeps a session on the replica that holds its prefix, ``request/cache_keys.py``), and the user
part alone is the request's ``user`` (the ledger's hashed user id, and what a ``forward_user`` backend
is told): a user's spend is then the user's, not each session's apart.
"""

from __future__ import annotations

import orjson

LEGACY_SESSION = "_session_"


def user_and_session(user_id: str) -> tuple[str, str | None]:
    """The user part of a Messages ``metadata.user_id`` and the session id in it, if any; any other
    string is the user's id as it is, with no session."""
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return user_id, None
        if not isinstance(parsed, dict):
            return user_id, None
        session = parsed.pop("session_id", None)
        user = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
        return user, session if isinstance(session, str) and session else None
    if user_id.startswith("user_"):
        user, separator, session = user_id.rpartition(LEGACY_SESSION)
        if separator and user and session:
            return user, session
    return user_id, None
