"""What a request costs, the one place cost arithmetic lives: per-token prices, GPU-hour pools spread
over measured throughput, the token split of a bill (cached input, reasoning billed once), and the
expected cost of a request before it is sent (from predicted output length, thinking included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gateway.policy.compiled import CompiledBackend
from gateway.policy.schema import Thinking
from gateway.values.observation import Usage

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MTOK = 1e6

# Output tokens expected before any history: a mandatory-thinking model reasons at length first.
# The policy's ``tuning.prior_output_tokens`` sets each backend's own; these are its defaults.
PRIOR_OUTPUT_TOKENS: Mapping[Thinking, float] = MappingProxyType(
    {"mandatory": 1000.0, "optional": 400.0, "none": 400.0}
)


@dataclass(frozen=True, slots=True)
class Cost:
    usd: float
    basis: str  # "per_token", "gpu_hours_amortized" or "gpu_hours_unmeasured"
    prefill_usd: float = 0.0  # a pool's share of ``usd`` for processing the prompt


def pool_usd_per_token(usd_per_hour: float, tokens_per_s: float) -> float:
    """The GPU-hour formula: a pool's hourly price spread over the output tokens it makes in an hour."""
    return usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR)


def per_mtok(usd_per_token: float) -> float:
    """USD per token as people quote it: per 1M tokens."""
    return usd_per_token * TOKENS_PER_MTOK


def per_token(usd_per_mtok: float) -> float:
    """A price quoted per 1M tokens, per token."""
    return usd_per_mtok / TOKENS_PER_MTOK


def usd_per_mtok_of(cost_usd: float, tokens: int) -> float | None:
    """What a spend came to per 1M tokens, None when no token was made."""
    return cost_usd / tokens * TOKENS_PER_MTOK if tokens else None


def pool_tokens_per_s(backend: CompiledBackend, aggregate_tokens_per_s: float | None) -> float | None:
    """Measured aggregate output tokens/s of a GPU-hour pool, else the policy's assumption."""
    if aggregate_tokens_per_s is not None and aggregate_tokens_per_s > 0:
        return aggregate_tokens_per_s
    return backend.pool_price.assumed_tokens_per_s if backend.pool_price is not None else None


def pool_prefill_tokens_per_s(backend: CompiledBackend, measured: float | None) -> float:
    """A pool's prompt-processing speed: measured on long prompts, else the policy's prior."""
    return measured if measured is not None and measured > 0 else backend.prior_prefill_tokens_per_s


def pool_usd_per_prompt_token(usd_per_hour: float, prefill_tokens_per_s: float) -> float:
    """The GPU time one uncached prompt token holds the pool for, at the pool's hourly price."""
    return usd_per_hour / (prefill_tokens_per_s * SECONDS_PER_HOUR)


def attempt_cost(
    backend: CompiledBackend,
    usage: Usage,
    aggregate_tokens_per_s: float | None,
    prefill_tokens_per_s: float | None = None,
) -> Cost:
    """The cost of one finished attempt; reasoning tokens are part of completion tokens, billed once.

    A GPU-hour pool charges the attempt its time share of the pool: the hour's price times the
    seconds the pool spent on it, prefill (uncached prompt tokens at its measured prefill speed)
    plus decode (output tokens at its measured aggregate speed). A long prompt is not free on a GPU.
    """
    prices = backend.token_prices
    if prices is not None:
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
        usd = (
            (usage.prompt_tokens - cached) * prices.input
            + cached * prices.cached_input
            + (usage.completion_tokens - reasoning) * prices.output
            + reasoning * prices.reasoning
        )
        return Cost(usd, "per_token")
    pool = backend.pool_price
    if pool is None:
        raise ValueError(f"backend {backend.name!r} has no price")
    tokens_per_s = pool_tokens_per_s(backend, aggregate_tokens_per_s)
    if tokens_per_s is None:
        # Nothing measured and nothing assumed: the ledger's idle remainder will hold this spend.
        return Cost(0.0, "gpu_hours_unmeasured")
    uncached = max(0, usage.prompt_tokens - usage.cached_prompt_tokens)
    prefill_rate = pool_prefill_tokens_per_s(backend, prefill_tokens_per_s)
    prefill = uncached * pool_usd_per_prompt_token(pool.usd_per_hour, prefill_rate)
    decode = usage.completion_tokens * pool_usd_per_token(pool.usd_per_hour, tokens_per_s)
    return Cost(prefill + decode, "gpu_hours_amortized", prefill)


def effective_usd_per_mtok(backend: CompiledBackend, aggregate_tokens_per_s: float | None) -> float | None:
    """USD per 1M output tokens: the list price, or a pool's hourly price over its live throughput."""
    if backend.token_prices is not None:
        return per_mtok(backend.token_prices.output)
    pool = backend.pool_price
    tokens_per_s = pool_tokens_per_s(backend, aggregate_tokens_per_s)
    if pool is None or tokens_per_s is None:
        return None
    return per_mtok(pool_usd_per_token(pool.usd_per_hour, tokens_per_s))


def prior_output_tokens(backend: CompiledBackend) -> float:
    """Completion tokens to expect from ``backend`` before any has been measured."""
    prior = backend.prior_output_tokens
    return PRIOR_OUTPUT_TOKENS[backend.thinking] if prior is None else prior


# The context window assumed for a backend whose policy gives none: the most any request is counted to
# generate there. 2^20 tokens is beyond every model served today, and still bounds a ``max_tokens`` of
# billions to a reservation a budget can hold.
DEFAULT_CONTEXT_WINDOW = 1 << 20


def bounded_max_tokens(
    max_tokens: int | None, prompt_tokens: int, backends: Iterable[CompiledBackend]
) -> int | None:
    """What a request's ``max_tokens`` can really produce: no more than the largest context window
    among its candidates leaves after the prompt. Prediction, budgets and rate limits count this;
    the upstream still receives what the client asked for."""
    if max_tokens is None:
        return None
    window = max(
        (b.context_window or DEFAULT_CONTEXT_WINDOW for b in backends), default=DEFAULT_CONTEXT_WINDOW
    )
    return max(1, min(max_tokens, window - prompt_tokens))


def predict_output_tokens(prior: float, learned: float | None, max_tokens: int | None) -> float:
    """Completion tokens to expect: the learned mean for this route and backend, else the prior,
    never more than the request allows."""
    predicted = learned if learned is not None else prior
    return min(predicted, float(max_tokens)) if max_tokens is not None else predicted


CostRates = tuple[float, float | None]  # USD per prompt token, per output token (None: unknown yet)


def cost_rates(
    backend: CompiledBackend,
    usd_per_mtok_out: float | None,
    marginal_headroom: bool,
    prefill_tokens_per_s: float | None = None,
) -> CostRates:
    """What sending a request to ``backend`` now costs per prompt token and per output token, given its
    effective output price (``effective_usd_per_mtok``). With marginal accounting a pool that has
    SLO-safe headroom costs nothing more: its hour is paid for."""
    prices = backend.token_prices
    if prices is not None:
        # The split between reasoning and answer is unknown before sending: price it all as output.
        return prices.input, prices.output
    pool = backend.pool_price
    if pool is not None and pool.accounting == "marginal" and marginal_headroom:
        return 0.0, 0.0
    per_prompt = 0.0
    if pool is not None:
        prefill_rate = pool_prefill_tokens_per_s(backend, prefill_tokens_per_s)
        per_prompt = pool_usd_per_prompt_token(pool.usd_per_hour, prefill_rate)
    return per_prompt, None if usd_per_mtok_out is None else per_token(usd_per_mtok_out)


def expected_cost(rates: CostRates, prompt_tokens: int, predicted_output_tokens: float) -> float | None:
    """Expected USD of a request at ``rates``; None when it cannot be known yet."""
    per_prompt, per_output = rates
    if per_output is None:
        return None
    return prompt_tokens * per_prompt + predicted_output_tokens * per_output


def cached_discount(backend: CompiledBackend, rates: CostRates, cached_tokens: int) -> float:
    """What ``cached_tokens`` of the prompt take off the expected cost at ``rates``: a paid API bills
    them at its cached-input price instead of its input price; a pool skips their prefill."""
    if cached_tokens <= 0:
        return 0.0
    prices = backend.token_prices
    cached_price = prices.cached_input if prices is not None else 0.0
    return cached_tokens * max(0.0, rates[0] - cached_price)


def amortized_expected_cost(
    backend: CompiledBackend,
    usd_per_mtok_out: float | None,
    predicted_output_tokens: float,
    routing_usd: float,
) -> float:
    """What the ledger will likely charge: the routing estimate, except that a GPU-hour pool is priced
    amortized even where routing counts its headroom as free (marginal), because the ledger charges
    every request its share of the pool's hour. Budgets reserve this."""
    if backend.pool_price is None:
        return routing_usd
    # No measured or assumed throughput: the ledger will charge nothing either ("gpu_hours_unmeasured").
    return 0.0 if usd_per_mtok_out is None else predicted_output_tokens * per_token(usd_per_mtok_out)
