"""A backend's prices, evaluated once when the policy loads: per token as written, from litellm's price
map (read offline; litellm is imported for a policy that uses it, and only then), or a GPU pool's hourly
price; and a dummy request priced once, so arithmetic that would overflow fails at load, not on a
request. The client for ``dialect: litellm`` (``backends/via_litellm.py``) imports litellm through
``import_litellm`` here too, so both say the same thing when it is missing.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from typing import Any

from gateway.money.costs import per_token, pool_usd_per_token
from gateway.policy import schema
from gateway.policy.compiled import PoolPrice, TokenPrices
from gateway.policy.document import Loc

INSTALL_HINT = "this needs litellm (native provider APIs, the price map): pip install 'litellm==1.110.2'"


def import_litellm() -> Any:
    """litellm, or a one-line RuntimeError saying what to install (never a traceback)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-map fetch at import
    try:
        import litellm
    except Exception as exc:  # a missing or broken install: both are the same advice
        raise RuntimeError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    return litellm


PROBE_TOKENS = 1_000_000


class BackendProblem(Exception):
    """A problem in one backend's section of the policy, at ``loc`` under it."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc, self.message = loc, message


def backend_prices(pricing: schema.Pricing) -> tuple[TokenPrices | None, PoolPrice | None, str]:
    if pricing.per_token is not None:
        p = pricing.per_token
        cached = p.input_usd_per_mtok if p.cached_input_usd_per_mtok is None else p.cached_input_usd_per_mtok
        reasoning = p.output_usd_per_mtok if p.reasoning_usd_per_mtok is None else p.reasoning_usd_per_mtok
        prices = TokenPrices(
            input=per_token(p.input_usd_per_mtok),
            cached_input=per_token(cached),
            output=per_token(p.output_usd_per_mtok),
            reasoning=per_token(reasoning),
        )
        return prices, None, "per_token"
    if pricing.litellm is not None:
        return _litellm_prices(pricing.litellm.model), None, f"litellm:{pricing.litellm.model}"
    assert pricing.gpu_hours is not None  # the schema guarantees exactly one basis
    g = pricing.gpu_hours
    return None, PoolPrice(g.usd_per_hour, g.accounting, g.assumed_tokens_per_s), "gpu_hours"


def require_litellm(loc: Loc) -> Any:
    """litellm, imported for a policy that uses it; a missing or broken install is a one-line problem."""
    try:
        return import_litellm()
    except RuntimeError as exc:
        raise BackendProblem(loc, str(exc)) from None


def _litellm_prices(model: str) -> TokenPrices:
    """Per-token prices from litellm's bundled price map, read offline (litellm is imported only here)."""
    loc = ("pricing", "litellm", "model")
    litellm = require_litellm(loc)

    table: Mapping[str, Any] = litellm.model_cost
    entry = table.get(model) if model != "sample_spec" else None  # sample_spec documents the format
    if not isinstance(entry, Mapping):
        hint = difflib.get_close_matches(model, [k for k in table if k != "sample_spec"], n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise BackendProblem(loc, f"unknown model {model!r} in litellm's price map{did_you_mean}")

    def cost(key: str, default: float | None) -> float:
        value = entry.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise BackendProblem(loc, f"litellm's price map has no usable {key} for {model!r}")
        return float(value)

    input_cost, output_cost = cost("input_cost_per_token", None), cost("output_cost_per_token", None)
    return TokenPrices(
        input=input_cost,
        cached_input=cost("cache_read_input_token_cost", input_cost),
        output=output_cost,
        reasoning=cost("output_cost_per_reasoning_token", output_cost),
    )


def probe_cost(tokens: TokenPrices | None, pool: PoolPrice | None) -> None:
    """Price a dummy request once, so arithmetic that would overflow on a request fails at load."""
    if tokens is not None:
        cost = PROBE_TOKENS * (tokens.input + tokens.cached_input + tokens.output + tokens.reasoning)
        if not math.isfinite(cost):
            raise BackendProblem(("pricing",), "price too large to compute a request's cost")
    if pool is not None and pool.assumed_tokens_per_s is not None:
        cost = PROBE_TOKENS * pool_usd_per_token(pool.usd_per_hour, pool.assumed_tokens_per_s)
        if not math.isfinite(cost):
            loc = ("pricing", "gpu_hours", "assumed_tokens_per_s")
            raise BackendProblem(loc, "too small to compute a cost per token from")
