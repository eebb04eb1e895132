"""Learning without spending users' requests, in virtual time: probes forget a slow spell and close an
open circuit, a 429 pauses instead of failing, the wait queue serves by deadline, full pools within
their SLO still take requests when the route allows, and a pool's cost counts prefill."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from gateway.measure.recovery import NOT_EXCLUDED, RecoveryBar, recovery_bar
from gateway.measure.stats import LiveStats
from gateway.money.costs import attempt_cost
from gateway.policy.decide import Decision, decide
from gateway.policy.schema import Slo
from gateway.runtime.waiting import WaitingRoom, retry_after_seconds
from gateway.values.observation import Usage
from tests.unit.factories import FakeClock, attempt, policy, pool_backend, route, serve
from tests.unit.test_decide import REQUEST, _healthy_views, _three_tier


def _probe(
    stats: LiveStats,
    clock: FakeClock,
    backend: str,
    ttft_s: float,
    bar: RecoveryBar = NOT_EXCLUDED,
    tokens_per_s: float = 92.0,
) -> None:
    ticket = stats.attempt_started(backend, probe=True)
    tokens = 1 if bar.decode_tokens_per_s is None else 16
    done = attempt(backend, clock.now, ttft_s=ttft_s, completion_tokens=tokens, tokens_per_s=tokens_per_s)
    done.probe = True
    assert done.finished_at is not None
    clock.now = done.finished_at
    stats.probe_finished(ticket, done, recovery_probes=2, ratio=0.5, bar=bar)


def test_fast_probes_after_a_slow_spell_make_the_stats_forget_it() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(100):
        serve(stats, clock, "b300", ttft_s=6.0)
    _probe(stats, clock, "b300", ttft_s=1.0)
    clock.advance(1.0)
    assert stats.recovering("b300") and (stats.view("b300").ttft_p95_s or 0) > 5.0, "one probe proves little"
    _probe(stats, clock, "b300", ttft_s=1.0)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == 1.0 and view.samples == 2 and view.probes == 2
    assert view.last_user_sample_at is not None and view.last_probe_at is not None


def test_a_slow_probe_forgets_nothing() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(20):
        serve(stats, clock, "b300", ttft_s=6.0)
    for _ in range(3):
        _probe(stats, clock, "b300", ttft_s=5.5)
    clock.advance(1.0)
    assert stats.view("b300").samples == 23 and not stats.recovering("b300")


def _slow_spell_among_fast_samples(stats: LiveStats, clock: FakeClock) -> None:
    """The issue's pool: mostly fast samples from before, a few slow ones from the spell, enough to put
    its p95 over a 2 s SLO while its median stays at 1 s."""
    for _ in range(100):
        serve(stats, clock, "b300", ttft_s=1.0, completion_tokens=2)
        clock.advance(0.25)
    for _ in range(10):
        serve(stats, clock, "b300", ttft_s=5.0, completion_tokens=2)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p50_s == 1.0 and (view.ttft_p95_s or 0) > 2.0


def test_probes_within_the_excluding_routes_slo_end_a_spell_the_median_never_saw() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    _slow_spell_among_fast_samples(stats, clock)
    view = stats.view("b300")
    slo_route = route(("b300", "api"), slo=Slo(ttft_p95_ms=2000))
    bar = recovery_bar("b300", [slo_route], view.ttft_p95_s, view.decode_tokens_per_s)
    assert bar == RecoveryBar(ttft_s=2.0)
    _probe(stats, clock, "b300", ttft_s=1.1, bar=bar)  # not half the median, but within the SLO
    assert stats.recovering("b300")
    _probe(stats, clock, "b300", ttft_s=1.1, bar=bar)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == 1.1 and view.samples == 2 and not stats.recovering("b300")


def test_a_probe_over_the_slo_ends_nothing_and_a_spells_late_answers_do_not_count_after_it() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    _slow_spell_among_fast_samples(stats, clock)
    bar = RecoveryBar(ttft_s=2.0)
    _probe(stats, clock, "b300", ttft_s=2.5, bar=bar)
    assert not stats.recovering("b300") and stats.view("b300").samples == 111
    straggler = stats.attempt_started("b300")  # sent during the spell, still running
    started = clock.now
    clock.advance(0.5)
    _probe(stats, clock, "b300", ttft_s=1.0, bar=bar)
    _probe(stats, clock, "b300", ttft_s=1.0, bar=bar)
    late = attempt("b300", started, ttft_s=6.0)
    clock.now = max(clock.now, late.finished_at or 0.0)
    stats.attempt_finished(straggler, late, "kimi-k3")
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == 1.0 and view.samples == 2, "the straggler belongs to the spell"


def test_a_route_excluding_a_pool_for_its_decode_speed_takes_it_back_when_probes_decode_fast() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(30):
        serve(stats, clock, "b300", tokens_per_s=8.0)  # a slow spell of decoding
    slo_route = route(("b300", "api"), slo=Slo(min_decode_tokens_per_s=20))
    view = stats.view("b300")
    bar = recovery_bar("b300", [slo_route], view.ttft_p95_s, view.decode_tokens_per_s)
    assert bar == RecoveryBar(decode_tokens_per_s=20.0)
    _probe(stats, clock, "b300", ttft_s=1.0, bar=bar, tokens_per_s=12.0)
    assert not stats.recovering("b300"), "fast to its first token, still too slow to decode"
    _probe(stats, clock, "b300", ttft_s=1.0, bar=bar, tokens_per_s=90.0)
    _probe(stats, clock, "b300", ttft_s=1.0, bar=bar, tokens_per_s=90.0)
    clock.advance(1.0)
    assert stats.view("b300").decode_tokens_per_s == pytest.approx(90.0)


def test_the_bar_is_the_loosest_slo_among_the_routes_a_backend_misses() -> None:
    tight = route(("b300",), name="tight", slo=Slo(ttft_p95_ms=1500))
    loose = route(("b300",), name="loose", slo=Slo(ttft_p95_ms=3000))
    met = route(("b300",), name="met", slo=Slo(ttft_p95_ms=9000))
    other = route(("api",), name="other", slo=Slo(ttft_p95_ms=4000))
    assert recovery_bar("b300", [tight, loose, met, other], 5.0, None) == RecoveryBar(ttft_s=3.0)
    assert not recovery_bar("b300", [tight, loose], 1.0, None).excluded
    assert not recovery_bar("b300", [tight, loose], None, None).excluded, "unmeasured: nothing to end"


def test_a_429_pauses_the_backend_and_never_opens_its_circuit() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(10):
        serve(stats, clock, "api", status="upstream_error", http_status=429)
    stats.pause("api", clock.now + 2.0)
    view = stats.view("api")
    assert view.circuit == "closed" and view.paused_until is not None and not stats.allows_request("api")
    clock.advance(2.5)
    assert stats.view("api").paused_until is None and stats.allows_request("api")


def test_a_successful_probe_closes_an_open_circuit() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(5):
        serve(stats, clock, "a100", status="upstream_error", http_status=500)
    assert stats.view("a100").circuit == "open"
    _probe(stats, clock, "a100", ttft_s=1.0)
    assert stats.view("a100").circuit == "closed"


def test_a_paused_candidate_is_passed_over() -> None:
    pol, rt = _three_tier()
    views = _healthy_views()
    views["b300"] = replace(views["b300"], paused_until=99.0)
    decision = decide(REQUEST, rt, pol, views, random.Random(0))
    assert "b300" not in decision.order
    assert "paused by an upstream rate limit" in decision.evaluation("b300").why  # type: ignore[union-attr]


def test_a_full_pool_takes_more_only_when_its_predicted_ttft_meets_the_slo_and_the_route_allows() -> None:
    pool = pool_backend("b300", max_concurrency=4, accounting="marginal")
    full = replace(_healthy_views()["b300"], inflight=4, ttft_p95_s=0.5, service_time_s=4.0)
    rng = random.Random(0)
    strict = route(("b300",), slo=Slo(ttft_p95_ms=3000))
    assert decide(REQUEST, strict, policy([pool], [strict]), {"b300": full}, rng).order == ()
    generous = replace(strict, admit_beyond_max_concurrency=True)
    # One ahead at 4 per 4 s: about 1 s of queueing on top of 0.5 s is within 3 s.
    assert decide(REQUEST, generous, policy([pool], [generous]), {"b300": full}, rng).order == ("b300",)
    queued = replace(full, inflight=12)  # nine ahead: about 9 s of queueing
    assert decide(REQUEST, generous, policy([pool], [generous]), {"b300": queued}, rng).order == ()


def test_a_long_prompt_costs_its_prefill_on_a_pool_and_nothing_extra_on_an_api() -> None:
    pool = pool_backend("b300", usd_per_hour=36.0)  # a cent a second
    short = attempt_cost(pool, Usage(prompt_tokens=200, completion_tokens=100), 100.0, 20_000.0)
    long = attempt_cost(pool, Usage(prompt_tokens=200_000, completion_tokens=100), 100.0, 20_000.0)
    assert short.usd - short.prefill_usd == pytest.approx(long.usd - long.prefill_usd)
    assert long.prefill_usd == pytest.approx(0.1)  # 10 s of the pool's time
    cached = attempt_cost(pool, Usage(200_000, 100, cached_prompt_tokens=200_000), 100.0, 20_000.0)
    assert cached.prefill_usd == 0.0, "a cached prompt holds the GPU for nothing"


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_seconds("2", 0.0) == 2.0
    assert retry_after_seconds(None, 0.0) == 1.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", 1445412480.0) == 10.0
    assert retry_after_seconds("soon", 0.0) == 1.0


async def test_waiters_by_deadline_take_a_freed_candidate_nearest_deadline_first() -> None:
    clock = FakeClock()
    room = WaitingRoom(clock)
    base = route(("b300",))
    rt = replace(base, waiting=base.waiting.model_copy(update={"order": "deadline"}))
    free = {"slots": 0}
    served: list[str] = []
    pol, _ = _three_tier()
    views = _healthy_views()

    def redecide() -> Decision:
        if free["slots"] <= 0:
            return decide(
                REQUEST,
                rt,
                pol,
                {"b300": replace(views["b300"], inflight=64)},
                random.Random(0),
            )
        free["slots"] -= 1
        return decide(REQUEST, rt, pol, views, random.Random(0))

    async def wait(name: str, deadline: float) -> None:
        await room.wait(rt, deadline, 60.0, redecide, lambda: 1.0)
        served.append(name)

    late = asyncio.create_task(wait("late", clock.now + 500.0))
    await asyncio.sleep(0.01)
    early = asyncio.create_task(wait("early", clock.now + 100.0))
    await asyncio.sleep(0.05)
    assert room.waiting() == {"kimi-k3": 2} and not served
    free["slots"] = 1
    room.notify()
    await asyncio.wait_for(early, 2.0)
    assert served == ["early"]
    free["slots"] = 1
    room.notify()
    await asyncio.wait_for(late, 2.0)
    assert served == ["early", "late"] and room.waiting() == {"kimi-k3": 0}


def test_users_answers_from_other_traffic_end_a_spell_like_probes() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    _slow_spell_among_fast_samples(stats, clock)
    stats.set_recovery_bar("b300", RecoveryBar(ttft_s=2.0), recovery_probes=2)
    serve(stats, clock, "b300", route_name="batch", ttft_s=4.0, completion_tokens=2)  # still slow
    assert not stats.recovering("b300")
    serve(stats, clock, "b300", route_name="batch", ttft_s=1.0, completion_tokens=2)
    assert stats.recovering("b300")
    serve(stats, clock, "b300", route_name="batch", ttft_s=1.0, completion_tokens=2)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == 1.0 and view.samples == 2 and view.probes == 0
