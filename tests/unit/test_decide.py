"""Routing decisions: cheapest within SLO, moving off a slow backend and back, fallbacks, exploration."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from gateway.measure.backend_stats import BackendView
from gateway.measure.signals import LoadSignals
from gateway.measure.stats import LiveStats
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures, decide
from gateway.policy.schema import Slo
from tests.unit.factories import FakeClock, api_backend, attempt, policy, pool_backend, route, serve

REQUEST = RequestFeatures(route="kimi-k3", prompt_tokens=2000, max_tokens=None, stream=True)


def _measured(name: str, ttft_s: float, tokens_per_s: float, **kw: object) -> BackendView:
    fields: dict[str, object] = {
        "samples": 50,
        "last_sample_at": 1000.0,
        "ttft_p50_s": ttft_s * 0.8,
        "ttft_p95_s": ttft_s,
        "first_answer_p95_s": ttft_s * 10,
        "decode_tokens_per_s": tokens_per_s,
        "aggregate_tokens_per_s": tokens_per_s,
        "service_time_s": 12.0,
    }
    fields.update(kw)
    return BackendView(name, **fields)  # type: ignore[arg-type]


def _three_tier(
    *, b300_accounting: str = "marginal", api_output: float = 15.0, **route_kw: object
) -> tuple[CompiledPolicy, CompiledRoute]:
    backends: list[CompiledBackend] = [
        pool_backend("b300", usd_per_hour=62.93, accounting=b300_accounting),  # type: ignore[arg-type]
        pool_backend("a100", usd_per_hour=20.09),
        api_backend("api", output_per_mtok=api_output),
    ]
    kimi = route(("b300", "a100", "api"), **route_kw)  # type: ignore[arg-type]
    return policy(backends, [kimi]), kimi


def _healthy_views() -> dict[str, BackendView]:
    return {
        "b300": _measured("b300", 0.95, 92.0),
        "a100": _measured("a100", 8.0, 9.0),
        "api": _measured("api", 0.6, 60.0),
    }


def _decide(pol: CompiledPolicy, rt: CompiledRoute, views: dict[str, BackendView], seed: int = 0) -> Decision:
    return decide(REQUEST, rt, pol, views, random.Random(seed))


def test_idle_marginal_pool_is_the_cheapest_within_slo() -> None:
    pol, rt = _three_tier()
    decision = _decide(pol, rt, _healthy_views())
    assert decision.chosen == "b300" and decision.reason == "cheapest_within_slo"
    assert decision.order == ("b300", "api", "a100")  # the infeasible a100 is the last resort
    evals = {e.backend: e for e in decision.evals}
    assert evals["b300"].expected_cost_usd == 0.0 and evals["b300"].marginal_headroom
    assert evals["b300"].usd_per_mtok_out == pytest.approx(190.0, rel=0.05)
    assert evals["a100"].usd_per_mtok_out == pytest.approx(620.0, rel=0.05)
    assert evals["a100"].why == ("ttft p95 8.0s > slo 3.0s",) and not evals["a100"].feasible


def test_amortized_pool_loses_to_a_cheaper_api() -> None:
    pol, rt = _three_tier(b300_accounting="amortized")
    decision = _decide(pol, rt, _healthy_views())
    assert decision.order == ("api", "b300", "a100")
    assert decision.reason == "cheapest_within_slo"


def test_a_pool_past_its_headroom_costs_its_amortized_share() -> None:
    pol, rt = _three_tier()
    views = _healthy_views()
    views["b300"] = replace(
        views["b300"],
        service_time_s=0.05,
        signals=LoadSignals(scraped_at=1000.0, running=64, waiting=0),
    )
    decision = _decide(pol, rt, views)
    b300 = decision.evals[0]
    assert b300.feasible and not b300.marginal_headroom and b300.queue_wait_s > 0
    assert b300.expected_cost_usd == pytest.approx(1000 * 190e-6, rel=0.05)  # 1000 = mandatory thinking prior
    assert decision.chosen == "api"


def test_queue_from_load_signals_pushes_predicted_ttft_over_the_slo() -> None:
    pol, rt = _three_tier()
    views = _healthy_views()
    views["b300"] = replace(views["b300"], signals=LoadSignals(scraped_at=1000.0, running=64, waiting=10))
    decision = _decide(pol, rt, views)
    b300 = decision.evals[0]
    # Eleven requests ahead (ten waiting and this one) drain at 64 per 12 s of service time.
    assert b300.queue_wait_s == pytest.approx(11 * 12.0 / 64)
    views["b300"] = replace(views["b300"], signals=LoadSignals(scraped_at=1000.0, running=64, waiting=200))
    decision = _decide(pol, rt, views)
    assert decision.chosen == "api"
    assert decision.evals[0].why[0].startswith("ttft p95 ")


@pytest.mark.parametrize(
    ("when_infeasible", "order", "reason"),
    [
        ("fastest", ("api", "b300", "a100"), "no_feasible_fastest"),
        ("cheapest", ("b300", "api", "a100"), "no_feasible_cheapest"),
        ("reject", (), "rejected_no_feasible"),
    ],
)
def test_when_nothing_is_feasible(when_infeasible: str, order: tuple[str, ...], reason: str) -> None:
    pol, rt = _three_tier(api_output=300.0, slo=Slo(ttft_p95_ms=300.0), when_infeasible=when_infeasible)
    decision = _decide(pol, rt, _healthy_views())
    assert decision.order == order and decision.reason == reason
    assert not any(e.feasible for e in decision.evals)


def test_every_slo_field_is_checked() -> None:
    slo = Slo(ttft_p95_ms=3000.0, min_decode_tokens_per_s=50.0, first_answer_p95_ms=8000.0)
    pol, rt = _three_tier(slo=slo)
    evals = {e.backend: e for e in _decide(pol, rt, _healthy_views()).evals}
    assert (evals["b300"].meets_ttft, evals["b300"].meets_decode, evals["b300"].meets_first_answer) == (
        True,
        True,
        False,
    )
    assert evals["b300"].why == ("first answer p95 9.5s > slo 8.0s",)
    assert evals["api"].feasible
    assert "decode 9.0 tok/s < slo 50.0 tok/s" in evals["a100"].why


def test_unmeasured_candidates_rank_after_measured_feasible_ones_and_serve_when_none_is() -> None:
    pol, rt = _three_tier()
    views = _healthy_views()
    views["api"] = BackendView("api")
    decision = _decide(pol, rt, views)
    assert decision.order == ("b300", "api", "a100")
    assert "unmeasured" in decision.evals[2].why and decision.evals[2].feasible
    views["b300"] = _measured("b300", 6.0, 92.0)
    decision = _decide(pol, rt, views)
    assert decision.chosen == "api" and decision.reason == "unmeasured_candidate"


def test_ineligible_backends_never_appear_in_the_order() -> None:
    pol, rt = _three_tier()
    views = _healthy_views()
    views["b300"] = replace(views["b300"], circuit="open", accepts_requests=False)
    views["api"] = replace(views["api"], healthy=False, booting=True)
    decision = _decide(pol, rt, views)
    assert decision.order == ("a100",) and decision.reason == "no_feasible_fastest"
    evals = {e.backend: e for e in decision.evals}
    assert evals["b300"].why[0] == "circuit open" and evals["api"].why[0] == "booting"
    views["a100"] = replace(views["a100"], inflight=64)
    decision = _decide(pol, rt, views)
    assert decision.order == () and decision.reason == "no_healthy_backend"
    assert "at max concurrency 64" in decision.evals[1].why


def test_a_prompt_too_long_for_the_context_window_is_not_sent() -> None:
    small = api_backend("small", context_window=1000)
    rt = route(("small", "api"))
    pol = policy([small, api_backend("api", output_per_mtok=20.0)], [rt])
    views = {"small": _measured("small", 0.5, 50.0), "api": _measured("api", 0.5, 50.0)}
    decision = decide(REQUEST, rt, pol, views, random.Random(0))
    assert decision.order == ("api",)


def test_fallbacks_are_truncated_to_max_attempts() -> None:
    pol, rt = _three_tier(max_attempts=2)
    assert _decide(pol, rt, _healthy_views()).order == ("b300", "api")


def test_single_backend_route_reports_only_candidate() -> None:
    rt = route(("b300",))
    pol = policy([pool_backend("b300")], [rt])
    decision = decide(REQUEST, rt, pol, {"b300": _measured("b300", 0.9, 92.0)}, random.Random(0))
    assert decision.order == ("b300",) and decision.reason == "only_candidate"


@pytest.mark.parametrize(
    ("objective", "chosen", "reason"),
    [
        ("lowest_ttft", "api", "fastest_within_slo"),
        ("highest_throughput", "b300", "highest_throughput_within_slo"),
    ],
)
def test_other_objectives(objective: str, chosen: str, reason: str) -> None:
    pol, rt = _three_tier(b300_accounting="amortized", objective=objective)
    decision = _decide(pol, rt, _healthy_views())
    assert decision.chosen == chosen and decision.reason == reason


def test_exploration_takes_about_its_share_and_prefers_the_stalest_candidate() -> None:
    pol, rt = _three_tier(exploration=0.02, slo=Slo())  # exploration is for routes without an SLO
    views = _healthy_views()
    views["api"] = replace(views["api"], last_sample_at=900.0)  # measured longer ago than a100
    rng = random.Random(7)
    outcomes = Counter(
        (d.reason, d.chosen) for d in (decide(REQUEST, rt, pol, views, rng) for _ in range(10_000))
    )
    explored = outcomes["exploration", "api"]
    assert 150 <= explored <= 250
    assert outcomes["cheapest_within_slo", "b300"] == 10_000 - explored


def test_same_inputs_give_the_same_decisions() -> None:
    pol, rt = _three_tier(exploration=0.3, slo=Slo())
    views = _healthy_views()
    first = [decide(REQUEST, rt, pol, views, rng) for rng in [random.Random(42)] for _ in range(200)]
    rng = random.Random(42)
    second = [decide(REQUEST, rt, pol, views, rng) for _ in range(200)]
    assert first == second
    assert {d.reason for d in first} == {"cheapest_within_slo", "exploration"}


def test_traffic_moves_off_a_slow_pool_and_back_after_it_recovers() -> None:
    """Requests served one after another in virtual time; a fault knob slows the pool's TTFT."""
    clock = FakeClock()
    stats = LiveStats(clock)
    pol, rt = _three_tier(exploration=0.05)  # ignored: the route has an SLO, probes measure instead
    rng = random.Random(1)
    ttft_by_backend = {"b300": 0.95, "a100": 8.0, "api": 0.6}
    speed_by_backend = {"b300": 92.0, "a100": 9.0, "api": 60.0}
    for name in rt.backends:  # first contact with every backend
        serve(stats, clock, name, ttft_s=ttft_by_backend[name], tokens_per_s=speed_by_backend[name])

    def run(requests: int) -> list[Decision]:
        decisions = []
        for _ in range(requests):
            decision = decide(REQUEST, rt, pol, stats.snapshot(rt.backends), rng)
            chosen = decision.chosen
            assert chosen is not None
            ttft = ttft_by_backend[chosen]
            serve(
                stats, clock, chosen, ttft_s=ttft, tokens_per_s=speed_by_backend[chosen], completion_tokens=93
            )
            decisions.append(decision)
        return decisions

    def share_of_pool(decisions: list[Decision]) -> float:
        return sum(d.chosen == "b300" for d in decisions[-50:]) / 50

    assert share_of_pool(run(200)) > 0.8
    ttft_by_backend["b300"] = 6.0  # the fault knob
    faulty = run(300)
    assert share_of_pool(faulty) < 0.2
    assert faulty[-1].reason == "cheapest_within_slo" and faulty[-1].chosen == "api"
    assert faulty[-1].evals[0].why == ("ttft p95 6.0s > slo 3.0s",)
    assert not any(d.reason == "exploration" for d in faulty), "no user request is spent on learning"
    ttft_by_backend["b300"] = 0.95  # recovered: two fast probes show it, and the slow spell is forgotten
    for _ in range(2):
        ticket = stats.attempt_started("b300")
        done = attempt("b300", clock.now, ttft_s=0.95, tokens_per_s=92.0, completion_tokens=1)
        done.probe = True
        assert done.finished_at is not None
        clock.now = done.finished_at
        stats.probe_finished(ticket, done, recovery_probes=2, ratio=0.5)
    recovered = run(500)
    assert share_of_pool(recovered) > 0.8


def test_a_fresh_gateway_sends_nothing_to_a_candidate_declared_outside_the_slo() -> None:
    # The start-up: an A100-like pool (7 s) and a paid API behind a 2 s SLO, nothing measured.
    a100 = replace(pool_backend("a100", usd_per_hour=20.09, accounting="marginal"), expected_ttft_s=7.0)
    api = replace(api_backend("api"), expected_ttft_s=1.5)
    rt = route(("a100", "api"), slo=Slo(ttft_p95_ms=2000))
    decision = _decide(policy([a100, api], [rt]), rt, {})
    assert decision.order == ("api", "a100") and decision.reason == "unmeasured_candidate"
    why = decision.evaluation("a100").why  # type: ignore[union-attr]
    assert "declared ttft 7.0s > slo 2.0s" in why and "unmeasured" in why
    # Undeclared, the cheap pool would have gone first: the declaration is what holds it back.
    bare = policy([replace(a100, expected_ttft_s=None), replace(api, expected_ttft_s=None)], [rt])
    assert _decide(bare, rt, {}).order == ("a100", "api")


def test_measured_within_the_slo_goes_before_declared_within_before_unknown() -> None:
    pool = pool_backend("b300", accounting="marginal")  # the cheapest: first among equals
    declared = replace(api_backend("api"), expected_ttft_s=1.0)
    other = api_backend("other", output_per_mtok=30.0)
    rt = route(("b300", "api", "other"), slo=Slo(ttft_p95_ms=2000))
    pol = policy([pool, declared, other], [rt])
    assert _decide(pol, rt, {}).order == ("api", "b300", "other")
    measured = {"other": _measured("other", 1.0, 60.0)}
    assert _decide(pol, rt, measured).order == ("other", "api", "b300")
    # Measured, the figure it declared no longer counts.
    slow = {"api": _measured("api", 5.0, 60.0)}
    assert _decide(pol, rt, slow).order == ("b300", "other", "api")
