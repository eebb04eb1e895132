"""An emulated prefix cache: prompt tokens shared with recent prompts are reported as cached."""

from __future__ import annotations

from collections import OrderedDict

CHARS_PER_TOKEN = 4


class PrefixCache:
    """Like vLLM's automatic prefix caching: a prompt is cut into fixed-size blocks, each keyed by a hash
    chained over every block before it, so a block counts as cached only if all before it matched too.
    """

    def __init__(self, block_tokens: int, capacity_blocks: int = 65_536) -> None:
        self._block_chars = block_tokens * CHARS_PER_TOKEN
        self._capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_store(self, text: str, prompt_tokens: int) -> int:
        """Cached tokens for this prompt; then remember its blocks for the prompts that follow."""
        if self._block_chars <= 0 or prompt_tokens <= 1:
            return 0
        # The last prompt token is always computed, so at most prompt_tokens - 1 can be cached.
        cacheable_chars = min(len(text), (prompt_tokens - 1) * CHARS_PER_TOKEN)
        full_blocks = cacheable_chars // self._block_chars
        chained = 0
        hits = 0
        still_matching = True
        for i in range(full_blocks):
            block = text[i * self._block_chars : (i + 1) * self._block_chars]
            chained = hash((chained, block))
            if still_matching and chained in self._blocks:
                hits += 1
                self._blocks.move_to_end(chained)
            else:
                still_matching = False
                self._blocks[chained] = None
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return hits * self._block_chars // CHARS_PER_TOKEN
