"""`gateway check FILE`: validate a policy and show what it compiles to, or every problem in it.

Exit status: 0 valid, 1 invalid (one ``file:line:col path: message`` line per problem), 2 unreadable.
With ``--live`` it also asks every backend about itself (``measure/live.py``); 1 when one a route needs
is unusable.
"""

from __future__ import annotations

import sys
from typing import TextIO

from gateway.money.costs import per_mtok, pool_usd_per_token
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.load import PolicyError, PolicyFileUnreadable, load_policy
from gateway.policy.schema import Slo


def check_main(path: str, out: TextIO = sys.stdout, *, live: bool = False) -> int:
    try:
        policy = load_policy(path)
    except PolicyFileUnreadable as exc:
        print(exc, file=out)
        return 2
    except PolicyError as exc:
        print(exc, file=out)
        return 1
    out.write(render_policy(policy))
    if live:
        from gateway.measure.live import live_check  # HTTP and rich only when asked to go live

        return live_check(policy, out)
    return 0


def render_policy(policy: CompiledPolicy) -> str:
    """A summary a person can check against what they meant: each route's candidates, prices and SLO."""
    counts = f"{plural(len(policy.backends), 'backend')}, {plural(len(policy.routes), 'route')}"
    lines = [f"{policy.source}: valid ({counts}, sha256 {policy.digest[:12]})"]
    for route in policy.routes.values():
        lines += ["", *render_route(route, policy)]
    if policy.warnings:
        lines += ["", "warnings:", *(f"  {w}" for w in policy.warnings)]
    return "\n".join(lines) + "\n"


def render_route(route: CompiledRoute, policy: CompiledPolicy) -> list[str]:
    fallback = route.fallback
    lines = [f"route {route.name}" + (f": {route.description}" if route.description else "")]
    if route.aliases:
        lines.append(f"  aliases: {', '.join(route.aliases)}")
    lines.append(f"  objective: {route.objective}, when infeasible: {route.when_infeasible}")
    lines.append(f"  slo: {describe_slo(route.slo)}")
    lines.append(
        f"  fallback: up to {plural(fallback.max_attempts, 'attempt')} within {fallback.deadline_s:g} s; "
        f"exploration {route.exploration:.0%}"
    )
    width = max(len(name) for name in route.backends)
    for i, name in enumerate(route.backends, start=1):
        backend = policy.backends[name]
        # Privacy is off by default: a backend that is sent the client's user ids says so here.
        forwards = "  (forward_user: gets the client's user ids)" if backend.forward_user else ""
        lines.append(f"  {i}. {name:<{width}}  {backend.dialect:<8}  {describe_price(backend)}{forwards}")
    return lines


def describe_slo(slo: Slo) -> str:
    parts = []
    if slo.ttft_p95_ms is not None:
        parts.append(f"TTFT p95 <= {slo.ttft_p95_ms:g} ms")
    if slo.first_answer_p95_ms is not None:
        parts.append(f"first answer p95 <= {slo.first_answer_p95_ms:g} ms")
    if slo.min_decode_tokens_per_s is not None:
        parts.append(f"decode >= {slo.min_decode_tokens_per_s:g} tok/s")
    return ", ".join(parts) if parts else "none (every healthy candidate is feasible)"


def describe_price(backend: CompiledBackend) -> str:
    """The effective price as people quote it: "$15.00/1M out" or "$62.93/h gpu_hours marginal"."""
    if backend.pool_price is not None:
        pool = backend.pool_price
        text = f"${pool.usd_per_hour:,.2f}/h gpu_hours {pool.accounting}"
        if pool.assumed_tokens_per_s is not None:
            price = per_mtok(pool_usd_per_token(pool.usd_per_hour, pool.assumed_tokens_per_s))
            text += f" (~{usd(price)}/1M out at {pool.assumed_tokens_per_s:g} tok/s until measured)"
        return text
    prices = backend.token_prices
    if prices is None:
        return "no price"
    parts = [f"{usd(per_mtok(prices.input))}/1M in"]
    if prices.cached_input != prices.input:
        parts.append(f"{usd(per_mtok(prices.cached_input))}/1M cached in")
    parts.append(f"{usd(per_mtok(prices.output))}/1M out")
    thinking = "thinking billed as output" if prices.reasoning == prices.output else None
    parts.append(thinking or f"{usd(per_mtok(prices.reasoning))}/1M thinking")
    return f"{backend.price_source or 'per_token'}: " + ", ".join(parts)


def usd(amount: float) -> str:
    """Cents for ordinary prices, more digits for fractions of a cent."""
    if abs(amount) >= 1 or round(amount, 2) == round(amount, 6):
        return f"${amount:,.2f}"
    return f"${amount:.4g}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
