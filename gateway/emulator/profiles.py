"""Performance profiles of the upstreams, from the published figures in DESIGN.md section 2.

A profile is data plus two formulas (time to first token, per-stream decode speed); durations are emulated.
The emulators (``gateway emulate``) and the simulator (``gateway simulate``) read the same profiles.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

DialectName = Literal["vllm", "llamacpp", "openai", "anthropic", "sglang"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    dialect: DialectName
    model: str
    owned_by: str
    # Time to first token with an empty queue: uniform in [ttft_min_s, ttft_max_s] ...
    ttft_min_s: float
    ttft_max_s: float
    # ... plus prompt processing for the uncached prompt tokens, capped (llama.cpp's slow prefill).
    prefill_s_per_token: float
    prefill_cap_s: float
    # Per-stream decode speed with one stream running; with n running it is tokens_per_s * n ** -exponent,
    # so aggregate throughput grows as n ** (1 - exponent).
    tokens_per_s: float
    batching_exponent: float
    max_running: int | None  # vLLM max_num_seqs or llama.cpp slots; None means unlimited
    reasoning_tokens: int
    content_tokens: int
    cold_boot_s: float
    context_tokens: int  # per sequence (per slot for llama.cpp)
    kv_capacity_tokens: int  # the whole KV cache, for the usage gauges
    cache_block_tokens: int  # prefix-cache granularity; 0 means no prefix cache
    # The prefix cache's bounds: tokens it holds (least recently used out first; 0: the whole KV cache,
    # ``kv_capacity_tokens``), how long a prefix lives after its last use (None: until evicted), and the
    # shortest prompt it caches at all.
    cache_capacity_tokens: int = 0
    cache_ttl_s: float | None = None
    cache_min_tokens: int = 0
    # The engine's command-line flags that change what it reports (docs/contracts/*.yaml): the profiles
    # carry the deploy/ recipes' flags, e.g. vLLM's --enable-prompt-tokens-details.
    engine_args: tuple[str, ...] = ()
    # The last part of a cold boot during which a server that refused connections while loading listens
    # and answers 503 (SGLang warming up), emulated seconds.
    warmup_s: float = 0.0
    # SGLang's /health runs a one-token generation and polls it once a second: real seconds, whatever the
    # time scale, because the engine's poll is wall-clock (sglang/srt/entrypoints/http_server.py:777-784).
    health_generation_s: float = 0.0

    def ttft_s(self, uncached_prompt_tokens: int, rng: random.Random) -> float:
        prefill = min(self.prefill_cap_s, uncached_prompt_tokens * self.prefill_s_per_token)
        return rng.uniform(self.ttft_min_s, self.ttft_max_s) + prefill

    def per_stream_tokens_per_s(self, running: int) -> float:
        return self.tokens_per_s * math.pow(max(1, running), -self.batching_exponent)

    def with_overrides(self, changes: Mapping[str, Any]) -> Profile:
        """This profile with some parameters changed (a smaller pool, a slower API); names are checked."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(
                f"unknown profile parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(self, **changes)


def resolve_profile(profile: str | Profile) -> Profile:
    """A profile by name (one of ``PROFILES``), or the given one as is."""
    if isinstance(profile, Profile):
        return profile
    if profile not in PROFILES:
        raise ValueError(f"unknown emulator profile {profile!r}; known: {', '.join(PROFILES)}")
    return PROFILES[profile]


def _build_profiles() -> dict[str, Profile]:
    b300 = Profile(
        name="b300-vllm",
        dialect="vllm",
        model="moonshotai/Kimi-K3",
        owned_by="vllm",
        ttft_min_s=0.92,
        ttft_max_s=1.02,
        # 12,000 prompt tokens/s: a B300 node serving Kimi K3 prefills ~10-15k tokens/s of one long prompt
        # (issue 30's figure; the policy's tuning.prior_prefill_tokens_per_s assumes 10,000). So 200k
        # uncached tokens add ~17 s to TTFT, a cache hit almost nothing.
        prefill_s_per_token=1.0 / 12_000.0,
        prefill_cap_s=600.0,
        tokens_per_s=92.0,
        batching_exponent=0.25,
        max_running=64,
        reasoning_tokens=64,
        content_tokens=32,
        cold_boot_s=27 * 60.0,
        context_tokens=262_144,
        kv_capacity_tokens=4_194_304,
        cache_block_tokens=16,
        engine_args=("--enable-prompt-tokens-details",),  # deploy/vllm/serve-kimi-k3.sh
    )
    a100 = Profile(
        name="a100-llamacpp",
        dialect="llamacpp",
        model="Kimi-K3-UD-IQ1_S",
        owned_by="llamacpp",
        ttft_min_s=7.0,
        ttft_max_s=7.0,
        # 53 s more at 8,000 prompt tokens, then no more: TTFT spans the measured 7-60 s.
        prefill_s_per_token=53.0 / 8000.0,
        prefill_cap_s=53.0,
        tokens_per_s=9.0,
        batching_exponent=0.5,
        max_running=4,
        reasoning_tokens=48,
        content_tokens=32,
        cold_boot_s=60.0,
        context_tokens=32_768,
        kv_capacity_tokens=4 * 32_768,
        cache_block_tokens=1,
    )
    paid = Profile(
        name="paid-api",
        dialect="openai",
        model="kimi-k3",
        owned_by="moonshotai",
        ttft_min_s=0.4,
        ttft_max_s=0.6,
        tokens_per_s=80.0,
        batching_exponent=0.0,
        max_running=None,
        reasoning_tokens=64,
        content_tokens=32,
        cold_boot_s=0.0,
        context_tokens=262_144,
        kv_capacity_tokens=0,
        # OpenAI's prompt caching: prompts of 1,024+ tokens, matched in 128-token steps, kept 5-10 minutes
        # after their last use (platform.openai.com/docs/guides/prompt-caching); Anthropic's default
        # cache_control lifetime is 5 minutes too. Billed at the cached-input price by the policy.
        cache_block_tokens=128,
        cache_capacity_tokens=1 << 30,
        cache_ttl_s=300.0,
        cache_min_tokens=1024,
        # Its prefill is fast but not free: 50k tokens/s, an assumption (providers publish no prefill
        # figure), so a 100k-token uncached prompt takes ~2 s more than a cached one.
        prefill_s_per_token=1.0 / 50_000.0,
        prefill_cap_s=30.0,
    )
    # A Messages-API vendor (Claude-like), reached through litellm's anthropic provider.
    anthropic = replace(
        paid,
        name="anthropic-api",
        dialect="anthropic",
        model="claude-emulated-4",
        owned_by="anthropic",
        ttft_min_s=0.5,
        ttft_max_s=0.7,
        tokens_per_s=70.0,
    )
    # SGLang serving the same model on the same GPUs as the vLLM pool, with its own metric names.
    sglang = replace(
        b300,
        name="h200-sglang",
        dialect="sglang",
        owned_by="sglang",
        tokens_per_s=85.0,
        engine_args=("--enable-metrics", "--enable-cache-report"),  # deploy/sglang/serve-kimi-k3.sh
        warmup_s=60.0,
        health_generation_s=1.2,
    )
    return {p.name: p for p in (b300, a100, paid, anthropic, sglang)}


# Immutable lookup table (profiles are frozen); the module holds no mutable state.
PROFILES: dict[str, Profile] = _build_profiles()
