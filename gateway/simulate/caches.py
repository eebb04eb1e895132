"""The backends' prefix caches in virtual time: what a request really finds cached where it is served.

- A pool replica (vLLM, SGLang, llama.cpp) keeps a bounded KV cache: its profile's
  ``kv_capacity_tokens``, evicting the least recently used prefix first. As vLLM frees a request's
  blocks tail first, a prompt's own prefix outlives its tail: the shared system prompt is the last
  thing to go, and a session's newest message the first.
- A paid API (OpenAI- or Anthropic-like) keeps a prefix for its profile's ``cache_ttl_s`` after its
  last use (OpenAI: "5-10 minutes of inactivity"), whatever the traffic, and caches no prompt shorter
  than ``cache_min_tokens``; it bills the cached part at its cached-input price.

Both match whole messages of a ``PromptShape`` (message boundaries with chained hashes), rounded down
to the backend's cache block, and never the prompt's last token (an engine always computes it).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from gateway.emulator.profiles import Profile
from gateway.simulate.workload import PromptShape

PRUNE_EVERY = 256  # TTL cache: drop expired entries every so many stores (memory stays bounded)


class PrefixCacheModel(Protocol):
    def serve(self, shape: PromptShape, prompt_tokens: int, now: float) -> int:
        """Cached prompt tokens for this prompt now; then its prefixes are cached for what follows."""
        ...


def _rounded(cached: int, prompt_tokens: int, block: int) -> int:
    cached = min(cached, prompt_tokens - 1)
    return max(0, cached - cached % block)


class LruKvCache:
    """A replica's KV cache: ``capacity_tokens`` of prefixes, least recently used evicted first."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.block_tokens = max(1, block_tokens)
        self.used_tokens = 0
        self._entries: OrderedDict[int, int] = OrderedDict()  # message hash -> its tokens

    def serve(self, shape: PromptShape, prompt_tokens: int, now: float) -> int:
        ends, hashes = shape
        entries = self._entries
        cached = 0
        for end, key in zip(ends, hashes, strict=True):
            if key not in entries:
                break
            cached = end
        # Touch tail first, so the prefix is the most recently used (evicted last).
        for i in range(len(ends) - 1, -1, -1):
            key = hashes[i]
            if key in entries:
                entries.move_to_end(key)
            else:
                size = ends[i] - (ends[i - 1] if i else 0)
                entries[key] = size
                self.used_tokens += size
        while self.used_tokens > self.capacity_tokens and entries:
            self.used_tokens -= entries.popitem(last=False)[1]
        return _rounded(cached, prompt_tokens, self.block_tokens)

    def holds(self, key: int) -> bool:
        return key in self._entries


class TtlCache:
    """A paid API's prompt cache: a prefix stays ``ttl_s`` after its last use."""

    def __init__(self, ttl_s: float, block_tokens: int, min_tokens: int = 0) -> None:
        self.ttl_s = ttl_s
        self.block_tokens = max(1, block_tokens)
        self.min_tokens = min_tokens  # a shorter prompt is not cached at all (OpenAI: 1,024)
        self._expires: dict[int, float] = {}
        self._stores = 0

    def serve(self, shape: PromptShape, prompt_tokens: int, now: float) -> int:
        if prompt_tokens < self.min_tokens:
            return 0
        ends, hashes = shape
        expires = self._expires
        cached = 0
        for end, key in zip(ends, hashes, strict=True):
            if expires.get(key, -1.0) < now:
                break
            cached = end
        until = now + self.ttl_s
        for key in hashes:
            expires[key] = until
        self._stores += 1
        if self._stores % PRUNE_EVERY == 0:
            self._expires = {k: t for k, t in expires.items() if t >= now}
        return _rounded(cached, prompt_tokens, self.block_tokens)


def cache_for(profile: Profile) -> PrefixCacheModel | None:
    """The prefix cache of a backend with this profile, bounded as the emulator's is
    (``gateway/emulator/prefix_cache.py``): by its TTL where it has one, else by its capacity (the
    profile's ``cache_capacity_tokens``, else its whole KV cache); None where it caches nothing."""
    block = profile.cache_block_tokens
    if block <= 0:
        return None
    if profile.cache_ttl_s is not None:
        return TtlCache(profile.cache_ttl_s, block, profile.cache_min_tokens)
    capacity = profile.cache_capacity_tokens or profile.kv_capacity_tokens
    if capacity <= 0:
        return None
    return LruKvCache(capacity, block)
