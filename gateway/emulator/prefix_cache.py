"""An emulated prefix cache: prompt tokens shared with recent prompts are reported as cached.

Bounded as the real ones are: an engine's KV cache holds ``capacity_tokens`` and evicts the least
recently used blocks first (vLLM's automatic prefix caching, SGLang's radix cache); a paid API keeps a
prompt's prefix for ``ttl_s`` after its last use (OpenAI and Anthropic: 5 minutes, refreshed on each
hit) and caches nothing shorter than its first block (1,024 tokens on OpenAI).
"""

from __future__ import annotations

from collections import OrderedDict

CHARS_PER_TOKEN = 4
# The dialects whose engines take a request's ``cache_salt`` (docs/contracts/, prefix_cache.salt).
SALTED_DIALECTS = frozenset(("vllm", "sglang"))


class PrefixCache:
    """Like vLLM's automatic prefix caching: a prompt is cut into fixed-size blocks, each keyed by a hash
    chained over every block before it, so a block counts as cached only if all before it matched too.
    """

    def __init__(
        self,
        block_tokens: int,
        capacity_blocks: int = 65_536,
        ttl_s: float | None = None,
        min_tokens: int = 0,
    ) -> None:
        self._block_chars = block_tokens * CHARS_PER_TOKEN
        self._capacity = max(1, capacity_blocks)
        self._ttl_s = ttl_s
        self._min_tokens = min_tokens
        self._blocks: OrderedDict[int, float] = OrderedDict()  # chained hash -> last used (emulated s)

    def lookup_and_store(
        self, text: str, prompt_tokens: int, now: float = 0.0, salt: str | None = None
    ) -> int:
        """Cached tokens for this prompt; then remember its blocks for the prompts that follow. A
        ``salt`` enters the first block's hash, so every block of a salted prompt is found only by a
        prompt with the same salt (vLLM: kv_cache_utils.py's extra keys; SGLang: its radix keys)."""
        if self._block_chars <= 0 or prompt_tokens <= 1:
            return 0
        # The last prompt token is always computed, so at most prompt_tokens - 1 can be cached.
        cacheable_chars = min(len(text), (prompt_tokens - 1) * CHARS_PER_TOKEN)
        full_blocks = cacheable_chars // self._block_chars
        if prompt_tokens < self._min_tokens:
            return 0
        horizon = None if self._ttl_s is None else now - self._ttl_s
        blocks = self._blocks
        size = self._block_chars
        chained = 0 if salt is None else hash(("cache_salt", salt))
        hits = 0
        still_matching = True
        chain: list[int] = []
        for i in range(full_blocks):
            chained = hash((chained, text[i * size : (i + 1) * size]))
            chain.append(chained)
            if still_matching:
                used = blocks.get(chained)
                if used is not None and (horizon is None or used >= horizon):
                    hits += 1
                else:
                    still_matching = False
        # Touched last block first, so the prompt's first blocks are the most recently used: an engine
        # evicts a prompt's tail before the prefix that other prompts share (vLLM frees a request's
        # blocks tail first into its LRU queue).
        for chained in reversed(chain):
            blocks.pop(chained, None)
            blocks[chained] = now
        while len(blocks) > self._capacity:
            blocks.popitem(last=False)
        return hits * self._block_chars // CHARS_PER_TOKEN
