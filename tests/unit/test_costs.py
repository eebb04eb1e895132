"""Costs: the published per-token figures come back out of live measurements, thinking billed once."""

from __future__ import annotations

import pytest

from gateway.measure.backend_stats import BackendView
from gateway.measure.stats import LiveStats
from gateway.money.costs import (
    attempt_cost,
    cost_rates,
    effective_usd_per_mtok,
    expected_cost,
    predict_output_tokens,
    prior_output_tokens,
)
from gateway.policy.compiled import CompiledBackend
from gateway.values.observation import Usage
from tests.unit.factories import FakeClock, api_backend, pool_backend, serve


@pytest.mark.parametrize(
    ("usd_per_hour", "tokens_per_s", "published_usd_per_mtok"),
    [(62.93, 92.0, 190.0), (20.09, 9.0, 620.0)],
    ids=["b300-vllm", "a100-llamacpp"],
)
def test_published_figures_come_out_of_measured_single_stream_speed(
    usd_per_hour: float, tokens_per_s: float, published_usd_per_mtok: float
) -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    pool = pool_backend(usd_per_hour=usd_per_hour)
    for _ in range(5):  # one stream at a time
        serve(stats, clock, pool.name, tokens_per_s=tokens_per_s, completion_tokens=500)
        clock.advance(2.0)
    view = stats.view(pool.name)
    assert view.aggregate_tokens_per_s == pytest.approx(tokens_per_s)
    per_mtok = effective_usd_per_mtok(pool, view.aggregate_tokens_per_s)
    assert per_mtok == pytest.approx(published_usd_per_mtok, rel=0.05)


def test_sixty_concurrent_streams_make_the_pool_cheaper_per_token() -> None:
    pool = pool_backend()
    one_stream = effective_usd_per_mtok(pool, 92.0)
    sixty_streams = effective_usd_per_mtok(pool, 60 * 40.0)
    assert one_stream is not None and sixty_streams is not None
    assert sixty_streams < 15.0 < one_stream  # cheaper than the $15/M API only when busy


def test_per_token_price_is_the_list_output_price() -> None:
    assert effective_usd_per_mtok(api_backend(output_per_mtok=15.0), None) == pytest.approx(15.0)


def test_unmeasured_pool_uses_the_assumed_throughput_or_admits_it_does_not_know() -> None:
    assert effective_usd_per_mtok(pool_backend(), None) is None
    assumed = pool_backend(assumed_tokens_per_s=92.0)
    assert effective_usd_per_mtok(assumed, None) == pytest.approx(190.0, rel=0.05)
    assert attempt_cost(pool_backend(), Usage(completion_tokens=10), None).basis == "gpu_hours_unmeasured"


def test_reasoning_tokens_are_billed_once_at_the_output_price() -> None:
    api = api_backend(input_per_mtok=1.0, output_per_mtok=15.0)
    usage = Usage(prompt_tokens=1000, completion_tokens=2000, reasoning_tokens=1500)
    cost = attempt_cost(api, usage, None)
    assert cost.basis == "per_token"
    assert cost.usd == pytest.approx(1000 * 1e-6 + 2000 * 15e-6)


def test_reasoning_priced_apart_is_billed_at_its_own_price() -> None:
    api = api_backend(input_per_mtok=0.0, output_per_mtok=10.0, reasoning_per_mtok=4.0)
    usage = Usage(completion_tokens=2000, reasoning_tokens=1500)
    assert attempt_cost(api, usage, None).usd == pytest.approx(500 * 10e-6 + 1500 * 4e-6)


def test_cached_prompt_tokens_are_billed_at_the_cached_price() -> None:
    api = api_backend(input_per_mtok=2.0, cached_per_mtok=0.5, output_per_mtok=0.0)
    usage = Usage(prompt_tokens=10_000, cached_prompt_tokens=8_000)
    assert attempt_cost(api, usage, None).usd == pytest.approx(2_000 * 2e-6 + 8_000 * 0.5e-6)


def test_gpu_hours_attempt_pays_its_time_share_of_the_pool() -> None:
    pool = pool_backend(usd_per_hour=62.93)
    cost = attempt_cost(pool, Usage(prompt_tokens=50, completion_tokens=1_000_000), 92.0)
    assert cost.basis == "gpu_hours_amortized"
    assert cost.usd == pytest.approx(190.0, rel=0.05)
    # Four streams share the pool: each token costs a quarter.
    shared = attempt_cost(pool, Usage(completion_tokens=1_000_000), 4 * 92.0)
    assert shared.usd == pytest.approx(cost.usd / 4)


def expected(
    backend: CompiledBackend, view: BackendView, prompt: int, output: float, headroom: bool
) -> float | None:
    usd_per_mtok = effective_usd_per_mtok(backend, view.aggregate_tokens_per_s)
    return expected_cost(cost_rates(backend, usd_per_mtok, headroom), prompt, output)


def test_marginal_pool_costs_nothing_with_headroom_and_its_amortized_share_beyond() -> None:
    pool = pool_backend(accounting="marginal")
    view = BackendView("b300", samples=10, decode_tokens_per_s=92.0, aggregate_tokens_per_s=92.0)
    assert expected(pool, view, 100, 1000.0, True) == 0.0
    beyond = expected(pool, view, 100, 1000.0, False)
    assert beyond == pytest.approx(1000 * 190e-6, rel=0.05)
    amortized = pool_backend(accounting="amortized")
    assert expected(amortized, view, 100, 1000.0, True) == pytest.approx(beyond)


def test_expected_cost_of_a_per_token_backend_counts_prompt_and_predicted_output() -> None:
    api = api_backend(input_per_mtok=1.0, output_per_mtok=15.0)
    view = BackendView("api")
    assert expected(api, view, 2000, 1000.0, True) == pytest.approx(0.002 + 0.015)


def test_output_prediction_prior_learned_and_bounded_by_max_tokens() -> None:
    assert prior_output_tokens(pool_backend()) == 1000.0  # mandatory thinking, the built-in prior
    assert predict_output_tokens(1000.0, None, None) == 1000.0
    assert predict_output_tokens(400.0, None, None) == 400.0
    assert predict_output_tokens(1000.0, 3200.0, None) == 3200.0
    assert predict_output_tokens(1000.0, 3200.0, 256) == 256.0


def test_output_length_is_learned_per_route_and_backend() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(10):
        serve(stats, clock, "b300", "chat", completion_tokens=3000)
        serve(stats, clock, "b300", "short", completion_tokens=50)
    view = stats.view("b300")
    assert view.learned_completion_tokens("chat") == pytest.approx(3000)
    assert view.learned_completion_tokens("short") == pytest.approx(50)
    assert view.learned_completion_tokens("other") is None
