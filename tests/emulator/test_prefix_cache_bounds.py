"""The emulators' prefix caches are bounded as the real ones: a pool's KV cache by capacity (least
recently used out first, a prompt's tail before its shared prefix), a paid API's by a TTL after the
last use, and nothing under its minimum prompt."""

from __future__ import annotations

from gateway.emulator.prefix_cache import CHARS_PER_TOKEN, PrefixCache
from gateway.emulator.profiles import PROFILES


def prompt(tag: str, tokens: int) -> str:
    return (tag * tokens * CHARS_PER_TOKEN)[: tokens * CHARS_PER_TOKEN]


def test_a_paid_api_forgets_a_prefix_five_minutes_after_its_last_use() -> None:
    paid = PROFILES["paid-api"]
    cache = PrefixCache(paid.cache_block_tokens, 1 << 20, paid.cache_ttl_s, paid.cache_min_tokens)
    text = prompt("a", 4096)
    assert cache.lookup_and_store(text, 4096, now=0.0) == 0
    assert cache.lookup_and_store(text, 4096, now=299.0) == 4096 - 128  # the last block is computed
    assert cache.lookup_and_store(text, 4096, now=598.0) == 4096 - 128  # each use refreshes it
    assert cache.lookup_and_store(text, 4096, now=899.0) == 0


def test_a_paid_api_caches_nothing_under_its_minimum() -> None:
    paid = PROFILES["paid-api"]
    cache = PrefixCache(paid.cache_block_tokens, 1 << 20, paid.cache_ttl_s, paid.cache_min_tokens)
    text = prompt("b", 1000)
    cache.lookup_and_store(text, 1000, now=0.0)
    assert cache.lookup_and_store(text, 1000, now=1.0) == 0


def test_a_full_kv_cache_evicts_the_least_recently_used_conversation() -> None:
    cache = PrefixCache(16, capacity_blocks=192)  # room for 3,072 tokens
    shared = prompt("s", 512)
    one, two = shared + prompt("1", 1536), shared + prompt("2", 1536)
    cache.lookup_and_store(one, 2048)  # 127 blocks (the last token is always computed)
    cache.lookup_and_store(two, 2048)  # 32 of them shared, 95 more: 222 > 192, so 30 blocks go ...
    assert cache.lookup_and_store(two, 2048) == 2048 - 16
    assert cache.lookup_and_store(one, 2048) == (127 - 30) * 16  # ... from one's tail, its prefix kept


def test_the_pool_profiles_prefill_long_prompts_at_their_published_speed() -> None:
    b300 = PROFILES["b300-vllm"]
    assert 10_000 <= 1 / b300.prefill_s_per_token <= 15_000
    assert b300.prefill_cap_s > 200_000 * b300.prefill_s_per_token  # 200k tokens are not free


def test_a_salted_prompt_is_found_only_under_its_own_salt() -> None:
    """As vLLM's cache_salt: the salt enters the first block's hash, so no block of it matches another
    salt's (or an unsalted) prompt, and the same salt finds all of it."""
    cache = PrefixCache(16, 1 << 16)
    text = prompt("m", 2048)
    assert cache.lookup_and_store(text, 2048, salt="bob") == 0
    assert cache.lookup_and_store(text, 2048, salt="alice") == 0
    assert cache.lookup_and_store(text, 2048) == 0
    assert cache.lookup_and_store(text, 2048, salt="bob") == 2048 - 16
