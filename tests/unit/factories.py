"""Small builders for unit tests: compiled backends, routes and policies, a fake clock, attempts."""

from __future__ import annotations

from typing import Any

from gateway.measure.stats import LiveStats
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute, PoolPrice, TokenPrices
from gateway.policy.schema import (
    Accounting,
    Fallback,
    Objective,
    Signals,
    Slo,
    Thinking,
    Timeouts,
    WhenInfeasible,
)
from gateway.values.observation import Attempt, AttemptStatus, Usage

MTOK = 1e6


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def api_backend(
    name: str = "api",
    *,
    input_per_mtok: float = 0.6,
    output_per_mtok: float = 15.0,
    cached_per_mtok: float | None = None,
    reasoning_per_mtok: float | None = None,
    thinking: Thinking = "mandatory",
    max_concurrency: int = 64,
    context_window: int | None = None,
) -> CompiledBackend:
    prices = TokenPrices(
        input=input_per_mtok / MTOK,
        cached_input=(cached_per_mtok if cached_per_mtok is not None else input_per_mtok) / MTOK,
        output=output_per_mtok / MTOK,
        reasoning=(reasoning_per_mtok if reasoning_per_mtok is not None else output_per_mtok) / MTOK,
    )
    return _backend(name, prices, None, thinking, max_concurrency, context_window)


def pool_backend(
    name: str = "b300",
    *,
    usd_per_hour: float = 62.93,
    accounting: Accounting = "amortized",
    assumed_tokens_per_s: float | None = None,
    thinking: Thinking = "mandatory",
    max_concurrency: int = 64,
) -> CompiledBackend:
    pool = PoolPrice(usd_per_hour, accounting, assumed_tokens_per_s)
    return _backend(name, None, pool, thinking, max_concurrency, None)


def _backend(
    name: str,
    prices: TokenPrices | None,
    pool: PoolPrice | None,
    thinking: Thinking,
    max_concurrency: int,
    context_window: int | None,
) -> CompiledBackend:
    return CompiledBackend(
        name=name,
        dialect="openai" if prices is not None else "vllm",
        base_url=f"http://{name}.invalid/v1",
        model="kimi-k3",
        token_prices=prices,
        pool_price=pool,
        thinking=thinking,
        max_concurrency=max_concurrency,
        context_window=context_window,
        signals=Signals(),
        timeouts=Timeouts(),
    )


def route(
    backends: tuple[str, ...],
    *,
    name: str = "kimi-k3",
    slo: Slo | None = None,
    objective: Objective = "lowest_cost",
    when_infeasible: WhenInfeasible = "fastest",
    max_attempts: int = 3,
    exploration: float = 0.0,
) -> CompiledRoute:
    return CompiledRoute(
        name=name,
        backends=backends,
        slo=slo if slo is not None else Slo(ttft_p95_ms=3000.0),
        objective=objective,
        when_infeasible=when_infeasible,
        fallback=Fallback(max_attempts=max_attempts),
        exploration=exploration,
    )


def policy(backends: list[CompiledBackend], routes: list[CompiledRoute]) -> CompiledPolicy:
    return CompiledPolicy(
        source="test.yaml",
        digest="0" * 64,
        backends={b.name: b for b in backends},
        routes={r.name: r for r in routes},
        max_body_bytes=4 * 1024 * 1024,
    )


def attempt(
    backend: str,
    started_at: float,
    *,
    ttft_s: float | None = 1.0,
    first_answer_s: float | None = None,
    completion_tokens: int = 921,
    tokens_per_s: float = 92.0,
    status: AttemptStatus = "ok",
    http_status: int | None = None,
    failed_after_s: float = 1.0,
) -> Attempt:
    """An attempt whose decode speed comes out at ``tokens_per_s`` (completion_tokens - 1 decoded)."""
    usage = Usage(prompt_tokens=100, completion_tokens=completion_tokens)
    decode_s = (completion_tokens - 1) / tokens_per_s
    finished = started_at + (ttft_s or 0.0) + decode_s if status == "ok" else started_at + failed_after_s
    return Attempt(
        backend=backend,
        started_at=started_at,
        status=status,
        http_status=http_status,
        ttft_s=ttft_s,
        first_answer_s=first_answer_s if first_answer_s is not None else ttft_s,
        finished_at=finished,
        usage=usage if status == "ok" else None,
    )


def serve(
    stats: LiveStats, clock: FakeClock, backend: str, route_name: str = "kimi-k3", **kw: Any
) -> Attempt:
    """Run one attempt through ``stats`` in virtual time: start, let the clock run its course, finish."""
    ticket = stats.attempt_started(backend)
    done = attempt(backend, clock.now, **kw)
    assert done.finished_at is not None
    clock.now = done.finished_at
    stats.attempt_finished(ticket, done, route_name)
    return done
