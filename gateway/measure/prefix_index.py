"""Where a prompt's prefix is cached: per backend, the prompt prefixes it served recently, as keys
cheap enough to compute on every request, aging out as that backend's own cache would (a TTL and a
capacity in tokens, both adjusted by the cached tokens the backend reports).

Pure: no I/O and nothing from the request path, so the simulator feeds the same index in virtual time.

Keys. An engine's prefix cache chains a hash over every block of the prompt; hashing the whole prompt
again here would cost ~1.5 us per message. Instead a key sits only at a message's end (where one turn's
prompt ends and the next turn's continues), only at the first ``FIRST_BOUNDARIES`` and the last
``LAST_BOUNDARIES`` message ends, and each key hashes what identifies that prefix cheaply: the first
two messages' signatures (the system prompt and the task: what tells conversations apart), the message
count, the characters up to that end, and that message's own signature (its length and a sample of its
text from both ends). A conversation is append-only, so the next turn's prompt carries the previous
turn's last boundaries unchanged, and a lookup is one dict get per key. Hashes are of ints and bytes
only (CRC-32 of UTF-8 samples, tuples of ints), never of ``str``: Python salts ``str`` hashes per
process, and the replicas of a gateway share these keys through the store.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FIRST_BOUNDARIES = 2  # the system prompt's end and the first turn's: where shared prefixes end
LAST_BOUNDARIES = 6  # the newest message ends: the previous turn's prompt ended at one of them
SAMPLE_CHARS = 32  # of each end of a message's text, in its signature
MAX_ENTRIES = 200_000  # per backend, whatever its capacity in tokens: the index's memory bound
MAX_CLIENT_KEYS = 50_000  # per backend
LEARN_MIN_TOKENS = 1024  # a prediction or report smaller than this teaches nothing (paid APIs' minimum)
LEARN_RATE = 0.25  # how far one surprising report moves the learned TTL towards what it showed


@dataclass(frozen=True, slots=True)
class PromptKeys:
    ends: tuple[int, ...]  # estimated prompt tokens up to each key boundary, increasing
    hashes: tuple[int, ...]  # chained hash of the prompt up to each boundary (same length as ends)
    client_key: str | None = None  # prompt_cache_key / a session header, when the client sends one

    @property
    def prompt_tokens(self) -> int:
        return self.ends[-1] if self.ends else 0


NO_KEYS = PromptKeys((), ())


def _text_chars(content: Any) -> int:
    """Characters of a message's text, counted as the prompt's token estimate counts them
    (``gateway.request.dialect.prompt_chars``), so that the boundaries add up to the prompt."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += len(text)
        return total
    return 0


def _sample(text: str) -> int:
    if len(text) > 2 * SAMPLE_CHARS:
        text = text[:SAMPLE_CHARS] + text[-SAMPLE_CHARS:]
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _signature(message: Any) -> int:
    """A message's identity, cheaply: its role, its text's length and a sample of both of its ends (or
    of its last part, or its first tool call)."""
    if not isinstance(message, dict):
        return 0
    role = message.get("role")
    content = message.get("content")
    tag = len(role) if isinstance(role, str) else 0
    if isinstance(content, str):
        return hash((tag, len(content), _sample(content)))
    if isinstance(content, list) and content:
        last = content[-1]
        text = last if isinstance(last, str) else last.get("text") if isinstance(last, dict) else None
        sample = _sample(text) if isinstance(text, str) else 0
        return hash((tag, len(content), _text_chars(content), sample))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        call_id = calls[0].get("id")
        return hash((tag, -1, _sample(call_id) if isinstance(call_id, str) else len(calls)))
    return hash((tag, -2))


def prompt_keys(
    payload: Mapping[str, Any],
    prompt_chars: int,
    chars_per_token: float,
    client_key: str | None = None,
) -> PromptKeys:
    """The keys of a chat (``messages``) or completions (``prompt``) payload whose text has
    ``prompt_chars`` characters in all; touches at most ``FIRST_BOUNDARIES + LAST_BOUNDARIES`` messages."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        prompt = payload.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return PromptKeys((), (), client_key)
        tokens = math.ceil(len(prompt) / chars_per_token)
        return PromptKeys((tokens,), (hash((1, len(prompt), _sample(prompt))),), client_key)
    count = len(messages)
    if count == 0:
        return PromptKeys((), (), client_key)
    first = messages[0]
    anchor = _signature(first)
    if count > 1:
        anchor = hash((anchor, _signature(messages[1])))
    # Characters up to each kept boundary: from the start for the first ones, back from the total for
    # the last ones, so the messages between are never looked at.
    ends: list[int] = []
    hashes: list[int] = []
    head = min(FIRST_BOUNDARIES, count)
    tail_from = max(head, count - LAST_BOUNDARIES)
    chars = 0
    for i in range(head):
        message = messages[i]
        chars += _text_chars(message.get("content") if isinstance(message, dict) else None)
        # The first boundary (the system prompt alone) is keyed by itself: shared by every conversation.
        key = hash((1, chars, _signature(message))) if i == 0 else hash((2, chars, anchor))
        ends.append(math.ceil(chars / chars_per_token))
        hashes.append(key)
    tail: list[tuple[int, int]] = []
    chars = prompt_chars
    for i in range(count - 1, tail_from - 1, -1):
        message = messages[i]
        tail.append((i, chars))
        chars -= _text_chars(message.get("content") if isinstance(message, dict) else None)
    for i, upto in reversed(tail):
        ends.append(math.ceil(upto / chars_per_token))
        hashes.append(hash((i + 1, upto, anchor, _signature(messages[i]))))
    return PromptKeys(tuple(ends), tuple(hashes), client_key)


@dataclass(slots=True)
class _Shelf:
    """One backend's part of the index: prefix hash -> (end in tokens, last used, tokens it adds)."""

    ttl_s: float
    capacity_tokens: int
    configured_ttl_s: float
    entries: dict[int, tuple[int, float, int]]
    clients: dict[str, tuple[int, float]]  # client key -> (prompt tokens, last used)
    tokens: int = 0  # what the entries hold, each prefix counted once
    predicted_hits: int = 0
    surprises: int = 0  # reports far from the prediction (either way)


class PrefixIndex:
    """Per backend, which prompt prefixes it served recently; entries age out by TTL and capacity."""

    def __init__(
        self,
        ttl_s: Callable[[str], float],
        capacity_tokens: Callable[[str], int],
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self._ttl_s = ttl_s
        self._capacity_tokens = capacity_tokens
        self._max_entries = max_entries
        self._shelves: dict[str, _Shelf] = {}

    def reconfigure(self) -> None:
        """Read each backend's TTL and capacity again (after a policy reload); learned TTLs restart."""
        for name, shelf in self._shelves.items():
            shelf.configured_ttl_s = shelf.ttl_s = self._ttl_s(name)
            shelf.capacity_tokens = self._capacity_tokens(name)

    def expected_cached(self, backend: str, keys: PromptKeys, now: float) -> int:
        """Prompt tokens of ``keys`` that ``backend`` likely still holds: the longest live prefix."""
        shelf = self._shelves.get(backend)
        if shelf is None:
            return 0
        entries, horizon, hashes = shelf.entries, now - shelf.ttl_s, keys.hashes
        found = 0
        for i in range(len(hashes) - 1, -1, -1):
            entry = entries.get(hashes[i])
            if entry is not None and entry[1] >= horizon:
                found = keys.ends[i]
                break
        if keys.client_key is not None and hashes and found < keys.ends[-1]:
            # The client says it is the same conversation, though the boundaries matched less (its
            # prompt grew by more than LAST_BOUNDARIES messages in one turn): the previous prompt is
            # likely held whole.
            known = shelf.clients.get(keys.client_key)
            if known is not None and known[1] >= horizon:
                found = max(found, min(known[0], keys.ends[-1]))
        return found

    def expected_cached_many(self, backends: Iterable[str], keys: PromptKeys, now: float) -> dict[str, int]:
        """``expected_cached`` for each of ``backends``, leaving out those that hold nothing."""
        found: dict[str, int] = {}
        if not keys.hashes:
            return found
        for name in backends:
            tokens = self.expected_cached(name, keys, now)
            if tokens:
                found[name] = tokens
        return found

    def record(self, backend: str, keys: PromptKeys, now: float, reported_cached: int | None = None) -> None:
        """``backend`` has just processed the prompt of ``keys``: all of it is in its cache now.
        ``reported_cached``: the cached tokens it reported for that prompt, which teach its TTL."""
        if not keys.hashes:
            return
        shelf = self._shelves.get(backend)
        if shelf is None:
            ttl = self._ttl_s(backend)
            shelf = self._shelves[backend] = _Shelf(ttl, self._capacity_tokens(backend), ttl, {}, {})
        if reported_cached is not None:
            self._learn(shelf, keys, now, reported_cached)
        entries = shelf.entries
        ends, hashes = keys.ends, keys.hashes
        # Longest first, so the shortest (shared) prefix is the most recently used: like an engine's
        # LRU, which evicts a conversation's own blocks before the system prompt every one shares.
        for i in range(len(hashes) - 1, -1, -1):
            old = entries.pop(hashes[i], None)
            adds = ends[i] - (ends[i - 1] if i else 0)
            shelf.tokens += adds - (0 if old is None else old[2])
            entries[hashes[i]] = (ends[i], now, adds)
        if keys.client_key is not None:
            clients = shelf.clients
            clients.pop(keys.client_key, None)
            clients[keys.client_key] = (ends[-1], now)
            if len(clients) > MAX_CLIENT_KEYS:
                del clients[next(iter(clients))]
        self._evict(shelf, now)

    def _evict(self, shelf: _Shelf, now: float) -> None:
        """Drop the least recently used entries past the capacity or the entry bound, and the expired."""
        entries = shelf.entries
        horizon = now - shelf.ttl_s
        while entries:
            oldest = next(iter(entries))
            _, used, adds = entries[oldest]
            if (
                used >= horizon
                and shelf.tokens <= shelf.capacity_tokens
                and len(entries) <= self._max_entries
            ):
                break
            del entries[oldest]
            shelf.tokens -= adds

    def _learn(self, shelf: _Shelf, keys: PromptKeys, now: float, reported: int) -> None:
        """A report far below the prediction says the cache forgets sooner than thought; one far above
        it, of a prefix held past the TTL, that it keeps longer. Each moves the TTL part of the way."""
        entries, hashes = shelf.entries, keys.hashes
        matched_age: float | None = None
        matched_end = 0
        for i in range(len(hashes) - 1, -1, -1):
            entry = entries.get(hashes[i])
            if entry is not None:
                matched_age, matched_end = now - entry[1], keys.ends[i]
                break
        if matched_age is None:
            return
        live = matched_age <= shelf.ttl_s
        if live and matched_end >= LEARN_MIN_TOKENS:
            shelf.predicted_hits += 1
        if live and matched_end >= LEARN_MIN_TOKENS and reported * 4 < matched_end:
            shelf.surprises += 1
            shelf.ttl_s = max(1.0, shelf.ttl_s - LEARN_RATE * (shelf.ttl_s - matched_age))
        elif not live and reported >= LEARN_MIN_TOKENS and reported * 4 >= matched_end * 3:
            shelf.surprises += 1
            longest = 4 * shelf.configured_ttl_s
            shelf.ttl_s = min(longest, shelf.ttl_s + LEARN_RATE * (matched_age - shelf.ttl_s) + 1.0)

    def report(self) -> dict[str, dict[str, float]]:
        """Per backend: entries, tokens held, the TTL in use, and how often reports surprised it."""
        return {
            name: {
                "entries": len(shelf.entries),
                "tokens": shelf.tokens,
                "ttl_s": shelf.ttl_s,
                "capacity_tokens": shelf.capacity_tokens,
                "predicted_hits": shelf.predicted_hits,
                "surprises": shelf.surprises,
            }
            for name, shelf in self._shelves.items()
        }
