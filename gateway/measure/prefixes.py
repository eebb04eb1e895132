"""The runtime's side of cache-aware routing: one ``PrefixIndex`` sized and timed by the running
policy's ``prefix_cache`` settings, what a decision expects of it, and what an answer teaches it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gateway.measure.prefix_index import NO_KEYS, KeyCarry, PrefixIndex, PromptKeys
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.evaluate import EMPTY_MAPPING, RequestFeatures
from gateway.values.observation import Observation

DEFAULT_TTL_S = 300.0  # a backend no longer in the policy: as a paid API's cache
DEFAULT_CAPACITY_TOKENS = 1 << 40


class Prefixes:
    def __init__(self, policy: Callable[[], CompiledPolicy], clock: Callable[[], float]) -> None:
        self._policy = policy
        self._clock = clock
        self.index = PrefixIndex(self._ttl_s, self._capacity_tokens)
        # Each conversation's last keys, so its next turn hashes only its new messages.
        self.carry = KeyCarry()
        # Called with each prompt an answer put in a backend's cache (the fleet shares them).
        self.recorded: Callable[[str, PromptKeys], None] | None = None

    def _ttl_s(self, backend: str) -> float:
        compiled = self._policy().backends.get(backend)
        return DEFAULT_TTL_S if compiled is None else compiled.prefix_cache_ttl_s

    def _capacity_tokens(self, backend: str) -> int:
        compiled = self._policy().backends.get(backend)
        return DEFAULT_CAPACITY_TOKENS if compiled is None else compiled.prefix_cache_capacity_tokens

    def expected(self, backends: Iterable[str], keys: PromptKeys) -> Mapping[str, int]:
        """Per backend, the prompt tokens of ``keys`` it likely holds (those holding none left out)."""
        return self.index.expected_cached_many(backends, keys, self._clock()) if keys.ends else {}

    def features(
        self,
        route: CompiledRoute,
        prompt_tokens: int,
        max_tokens: int | None,
        stream: bool,
        keys: PromptKeys = NO_KEYS,
        cache_key: str | None = None,
    ) -> RequestFeatures:
        """A decision's features with the cached tokens each candidate likely holds; ``cache_key``
        alone (/admin/explain): what that conversation's client key says is held."""
        if cache_key:
            keys = PromptKeys((prompt_tokens,), (), cache_key)
        cached = self.expected(route.backends, keys) if keys.ends else None
        return RequestFeatures(route.name, prompt_tokens, max_tokens, stream, cached or EMPTY_MAPPING)

    def remember(self, keys: PromptKeys, observation: Observation) -> None:
        """The backend that answered holds this prompt now; what it reported cached teaches the index
        its cache's lifetime."""
        final = observation.final
        if not keys.hashes or final is None or final.status != "ok":
            return
        usage = final.usage
        reported = usage.cached_prompt_tokens if usage is not None and usage.cached_reported else None
        self.index.record(final.backend, keys, self._clock(), reported)
        if self.recorded is not None:
            self.recorded(final.backend, keys)
