"""A prompt's keys for the prefix index (``gateway.measure.prefix_index``): one key at each of a few
message ends, each a keyed hash over the full text of every message up to that end.

An engine reuses a prefix only if every token of it matches, so a key stands for the whole text it
covers: two prompts of the same shape (the same lengths, the same first and last words) but another
figure in the middle get other keys. The hash is XXH3-64 chained message by message (each message's
digest seeds the next), keyed by its cache scope's seed (``gateway.policy.cache_scope``): prompts of
another scope (another API key, when the route isolates keys) never share a key, as an engine given
another ``cache_salt`` never shares a block. The seed and what it is derived from never leave the
gateway; the keys travel between replicas through the store, so no per-process salt may enter them
(Python's ``hash`` of ``str`` has one): XXH3 of UTF-8 bytes and of orjson's bytes does not.

Cost. Hashing a 200 KB agent prompt again on every turn costs ~10 us, twice the index's budget, so a
conversation's keys are carried from one turn to the next (``KeyCarry``): a turn whose client key
(prompt_cache_key, a session header) names a conversation of this scope seen before, with at least
as many messages, and whose new messages account for exactly the characters the prompt grew by, hashes
only its new messages and chains them to the previous turn's last digest. What the carry trusts
without reading it again: that the client did not rewrite an earlier message to another text of the
same length under the same conversation key and scope (its own prediction is then wrong; nobody
else's). A prompt without a client key is hashed whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson
from xxhash import xxh3_64_intdigest

from gateway.values.dialect import text_chars

FIRST_BOUNDARIES = 2  # the system prompt's end and the first turn's (fixed: prompt_keys unrolls them)
LAST_BOUNDARIES = 4  # the newest message ends: the previous turn's prompt ended at one of them
MAX_CARRIED = 50_000  # conversations whose keys are carried to their next turn (~0.5 KB each)
# Each role seeds its message's hash apart, so a user's text is never the assistant's.
_ROLE_SEEDS = {
    "system": 0x9E3779B97F4A7C15,
    "developer": 0xBF58476D1CE4E5B9,
    "user": 0x94D049BB133111EB,
    "assistant": 0x2545F4914F6CDD1D,
    "tool": 0xD6E8FEB86659FD93,
}
_COMPLETION_SEED = 0x632BE59BD9B4E019  # a completions prompt: never the keys of a chat's messages
_TOOLS_SEED = 0x5851F42D4C957F2D


class PromptKeys(NamedTuple):
    """A prompt's keys. A NamedTuple rather than a frozen dataclass: built once per request, and a
    frozen dataclass's ``__init__`` alone costs ~0.8 us, a sixth of the whole budget."""

    ends: tuple[int, ...]  # estimated prompt tokens up to each key boundary, increasing
    hashes: tuple[int, ...]  # chained hash of the prompt up to each boundary (same length as ends)
    client_key: str | None = None  # prompt_cache_key / a session header (scoped), when the client sends one

    @property
    def prompt_tokens(self) -> int:
        return self.ends[-1] if self.ends else 0


NO_KEYS = PromptKeys((), ())


class KeyCarry:
    """The keys of recent conversations' last turns, by (scope seed, client key): what the next turn
    of each continues from. Per process; a replica without the entry hashes the prompt whole and gets
    the same keys."""

    __slots__ = ("entries", "max_entries")

    def __init__(self, max_entries: int = MAX_CARRIED) -> None:
        self.max_entries = max_entries
        # (seed, client key) -> (messages, prompt chars, ends, hashes) of its last prompt
        self.entries: dict[tuple[int, str], tuple[int, int, tuple[int, ...], tuple[int, ...]]] = {}


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: still hashed, never an error
        return text.encode("utf-8", "surrogatepass")


def _digest(message: Any, seed: int) -> int:
    """The hash of one message chained to ``seed`` (the digest of everything before it): its text
    alone for the common ``{role, content: str}``, else every field of it as orjson writes them."""
    if type(message) is dict and len(message) == 2:
        content = message.get("content")
        role_seed = _ROLE_SEEDS.get(message.get("role"))  # type: ignore[arg-type]
        if type(content) is str and role_seed is not None:
            return xxh3_64_intdigest(_utf8(content), seed ^ role_seed)
    try:
        return xxh3_64_intdigest(orjson.dumps(message, option=orjson.OPT_SORT_KEYS), seed)
    except TypeError:  # not JSON (only a caller's own payload can be): its repr, still deterministic
        return xxh3_64_intdigest(_utf8(repr(message)), seed)


def _chars_of(message: Any) -> int:
    if type(message) is dict:
        content = message.get("content")
        return len(content) if type(content) is str else text_chars(content)
    return 0


def prompt_keys(
    payload: Mapping[str, Any],
    prompt_chars: int,
    chars_per_token: float,
    client_key: str | None = None,
    seed: int = 0,
    carry: KeyCarry | None = None,
) -> PromptKeys:
    """The keys of a chat (``messages``) or completions (``prompt``) payload whose text has
    ``prompt_chars`` characters in all, in the cache scope of ``seed``: at most ``FIRST_BOUNDARIES +
    LAST_BOUNDARIES`` of them, each over the full text up to its message's end. With ``carry``
    and a client key, a turn that continues the conversation's previous one hashes only its new
    messages."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        prompt = payload.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return PromptKeys((), (), client_key)
        tokens = math.ceil(len(prompt) / chars_per_token)
        return PromptKeys((tokens,), (xxh3_64_intdigest(_utf8(prompt), seed ^ _COMPLETION_SEED),), client_key)
    count = len(messages)
    if count == 0:
        return PromptKeys((), (), client_key)
    if carry is not None and client_key is not None and count > FIRST_BOUNDARIES:
        slot = (seed, client_key)
        previous = carry.entries.get(slot)
        if previous is not None:
            keys = _continued(messages, prompt_chars, chars_per_token, client_key, previous)
            if keys is not None:
                _keep(carry, slot, (count, prompt_chars, keys.ends, keys.hashes))
                return keys
        keys = _hashed(payload, messages, prompt_chars, chars_per_token, client_key, seed)
        _keep(carry, slot, (count, prompt_chars, keys.ends, keys.hashes))
        return keys
    return _hashed(payload, messages, prompt_chars, chars_per_token, client_key, seed)


def _keep(
    carry: KeyCarry, slot: tuple[int, str], entry: tuple[int, int, tuple[int, ...], tuple[int, ...]]
) -> None:
    entries = carry.entries
    entries.pop(slot, None)  # re-inserted last: the oldest conversation is dropped first
    entries[slot] = entry
    if len(entries) > carry.max_entries:
        del entries[next(iter(entries))]


def _hashed(
    payload: Mapping[str, Any],
    messages: list[Any],
    prompt_chars: int,
    chars_per_token: float,
    client_key: str | None,
    seed: int,
) -> PromptKeys:
    """Every message hashed: a first turn, a client without a conversation key, or a prompt that does
    not continue the carried one."""
    tools = payload.get("tools")
    if tools:  # the engine's template puts the tool definitions before the first message
        seed = _digest(tools, seed ^ _TOOLS_SEED)
    count = len(messages)
    # The first boundary (the system prompt alone) is shared by every conversation of the scope.
    first = _digest(messages[0], seed)
    chars = _chars_of(messages[0])
    if count == 1:
        return PromptKeys((math.ceil(chars / chars_per_token),), (first,), client_key)
    second = _digest(messages[1], first)
    ends = [math.ceil(chars / chars_per_token), math.ceil((chars + _chars_of(messages[1])) / chars_per_token)]
    hashes = [first, second]
    tail_from = max(FIRST_BOUNDARIES, count - LAST_BOUNDARIES)
    digest = second
    for i in range(FIRST_BOUNDARIES, tail_from):
        digest = _digest(messages[i], digest)
    if tail_from < count:
        # Characters up to each of the last boundaries, back from the total (the door's count).
        upto = prompt_chars - sum(_chars_of(messages[i]) for i in range(tail_from, count))
        for i in range(tail_from, count):
            message = messages[i]
            digest = _digest(message, digest)
            upto += _chars_of(message)
            ends.append(math.ceil(upto / chars_per_token))
            hashes.append(digest)
    return PromptKeys(tuple(ends), tuple(hashes), client_key)


def _continued(
    messages: list[Any],
    prompt_chars: int,
    chars_per_token: float,
    client_key: str,
    previous: tuple[int, int, tuple[int, ...], tuple[int, ...]],
) -> PromptKeys | None:
    """The keys of a turn that appends to the carried one, hashing only the appended messages; None
    when it does not (fewer messages, or the new ones do not add up to how much the prompt grew)."""
    before, before_chars, before_ends, before_hashes = previous
    count = len(messages)
    if count < before or before <= FIRST_BOUNDARIES:
        return None
    sizes = [_chars_of(messages[i]) for i in range(before, count)]
    if before_chars + sum(sizes) != prompt_chars:
        return None
    if count == before:
        return PromptKeys(before_ends, before_hashes, client_key)
    tail_from = max(FIRST_BOUNDARIES, count - LAST_BOUNDARIES)
    before_tail_from = max(FIRST_BOUNDARIES, before - LAST_BOUNDARIES)
    # The carried tail boundaries still among the last ones, then the new messages'.
    keep_from = FIRST_BOUNDARIES + max(0, tail_from - before_tail_from)
    ends = [*before_ends[:FIRST_BOUNDARIES], *before_ends[keep_from:]]
    hashes = [*before_hashes[:FIRST_BOUNDARIES], *before_hashes[keep_from:]]
    digest, upto = before_hashes[-1], before_chars
    for offset, i in enumerate(range(before, count)):
        digest = _digest(messages[i], digest)
        upto += sizes[offset]
        if i >= tail_from:
            ends.append(math.ceil(upto / chars_per_token))
            hashes.append(digest)
    return PromptKeys(tuple(ends), tuple(hashes), client_key)
