"""Where a prompt's prefix is cached: per backend, the prompt prefixes it served recently, as keys
cheap enough to compute on every request, aging out as that backend's own cache would (a TTL and a
capacity in tokens; the TTL adjusted by the cached tokens the backend reports).

Pure: no I/O and no state of the request path (only the dialect's character count, so the boundaries add
up to the prompt's token estimate), so the simulator feeds the same index in virtual time.

Keys (``gateway.measure.prefix_keys``): a key sits only at a message's end (where one turn's prompt
ends and the next turn's continues), only at the first ``FIRST_BOUNDARIES`` and the last
``LAST_BOUNDARIES`` message ends, each a keyed hash over the full text up to that end, in the
request's cache scope. A lookup is a few dict gets (``_held``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.measure.prefix_keys import (
    FIRST_BOUNDARIES,
    LAST_BOUNDARIES,
    NO_KEYS,
    KeyCarry,
    PromptKeys,
    prompt_keys,
)

__all__ = [
    "FIRST_BOUNDARIES",
    "LAST_BOUNDARIES",
    "NO_KEYS",
    "KeyCarry",
    "PrefixIndex",
    "PromptKeys",
    "prompt_keys",
]

MAX_ENTRIES = 200_000  # per backend, whatever its capacity in tokens: the index's memory bound
MAX_CLIENT_KEYS = 50_000  # per backend
LEARN_MIN_TOKENS = 1024  # a prediction or report smaller than this teaches nothing (paid APIs' minimum)
LEARN_RATE = 0.25  # how far one surprising report moves the learned TTL towards what it showed


def _held(shelf: _Shelf, keys: PromptKeys, now: float) -> int:
    horizon = now - shelf.ttl_s
    found = 0
    entries, hashes = shelf.entries, keys.hashes
    # The conversation's first turn (the second key) is touched by every record of it and evicted after
    # its later keys (``record`` inserts the longest first): a backend without it holds at most the
    # system prompt, found in two probes instead of one per key.
    gate = entries.get(hashes[1]) if len(hashes) > 2 else None
    if len(hashes) > 2 and (gate is None or gate[1] < horizon):
        entry = entries.get(hashes[0])
        if entry is not None and entry[1] >= horizon:
            found = entry[0]
    else:
        # Longest first, at C speed: most lookups end at the first key.
        for entry in filter(None, map(entries.get, reversed(hashes))):
            if entry[1] >= horizon:
                found = entry[0]
                break
    client_key = keys.client_key
    if client_key is not None and found <= keys.ends[min(FIRST_BOUNDARIES, len(keys.ends)) - 1]:
        # The client says it is the same conversation, though only its first boundaries matched (its
        # prompt grew by more than LAST_BOUNDARIES messages in one turn): the previous prompt is
        # likely held whole.
        known = shelf.clients.get(client_key)
        if known is not None and known[1] >= horizon:
            found = max(found, min(known[0], keys.ends[-1]))
    return found


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
        return 0 if shelf is None else _held(shelf, keys, now)

    def expected_cached_many(self, backends: Iterable[str], keys: PromptKeys, now: float) -> dict[str, int]:
        """``expected_cached`` for each of ``backends``, leaving out those that hold nothing."""
        found: dict[str, int] = {}
        if not keys.ends:  # nothing to look for (keys of only a client key still have their length)
            return found
        shelves = self._shelves
        for name in backends:
            shelf = shelves.get(name)
            if shelf is not None and (tokens := _held(shelf, keys, now)):
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
