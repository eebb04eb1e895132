"""Live stats in virtual time: decayed quantiles, speeds, concurrency, rates and cheap cached views."""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import FrozenInstanceError, fields, replace

import pytest

from gateway.measure.backend_stats import BackendView
from gateway.measure.decayed import DecayedMean, DecayedSamples
from gateway.measure.signals import LoadSignals
from gateway.measure.stats import LiveStats
from tests.unit.factories import FakeClock, attempt, serve


def test_quantiles_of_equally_fresh_samples() -> None:
    samples = DecayedSamples(window=256, half_life_s=60.0)
    for value in range(1, 101):
        samples.add(0.0, float(value))
    assert samples.quantiles(0.5, 0.95) == (50.0, 95.0)


def test_window_keeps_only_the_latest_samples() -> None:
    samples = DecayedSamples(window=256, half_life_s=1e9)
    for value in range(300):
        samples.add(float(value), 1000.0 if value < 44 else 1.0)
    assert len(samples) == 256
    assert samples.quantiles(1.0) == (1.0,)  # the 44 slow ones were pushed out


def test_quantiles_forget_old_samples_as_time_passes() -> None:
    samples = DecayedSamples(window=256, half_life_s=60.0)
    for i in range(50):
        samples.add(float(i), 10.0)  # slow, long ago
    fresh = samples.quantiles(0.95)
    for i in range(50):
        samples.add(600.0 + i, 1.0)  # fast, ten half-lives later
    later = samples.quantiles(0.95)
    assert fresh == (10.0,) and later == (1.0,)


def test_quantiles_from_running_sums_kept_between_looks_are_those_of_summing_them_all() -> None:
    # The running sums are kept up to the first place a sample went in or out since the last look;
    # they must give what summing every weight again gives, to the last bit, whatever came between:
    # samples with the window full or not, equal values, a rebase of the weights, forgotten samples.
    rng = random.Random(3)

    def summed_whole(samples: DecayedSamples, qs: tuple[float, ...]) -> tuple[float, ...]:
        running = list(itertools.accumulate(samples._sorted_weights))
        last = len(running) - 1
        return tuple(samples._sorted[bisect.bisect_left(running, q * running[-1], 0, last)] for q in qs)

    samples = DecayedSamples(window=64, half_life_s=5.0)
    at, looks = 0.0, 0
    for step in range(5_000):
        at += rng.expovariate(2.0)
        samples.add(at, float(rng.choice((0.5, 1.0, 2.0))) if step % 3 else rng.lognormvariate(0, 1))
        if step == 2_500:
            samples.forget_before(at - 3.0)
        if rng.random() < 0.4:
            qs = (0.5, 0.95, rng.random())
            assert samples.quantiles(*qs) == summed_whole(samples, qs), step
            looks += 1
    assert looks > 1_000 and at / 5.0 > DecayedSamples.REBASE, "the weights were rebased on the way"


def test_decayed_mean_leans_to_recent_values() -> None:
    mean = DecayedMean(half_life_s=10.0)
    mean.add(0.0, 100.0)
    mean.add(10.0, 0.0)
    assert mean.value == pytest.approx(100 * 0.5 / 1.5)


def test_live_ttft_quantiles_recover_after_a_bad_spell() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(40):
        serve(stats, clock, "b300", ttft_s=5.0)
    assert stats.view("b300").ttft_p95_s == pytest.approx(5.0)
    for _ in range(40):  # the same number of good ones, minutes later
        clock.advance(10.0)
        serve(stats, clock, "b300", ttft_s=0.9, first_answer_s=20.0)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == pytest.approx(0.9)
    assert view.first_answer_p95_s == pytest.approx(20.0)
    assert view.samples == 80


def test_decode_speed_and_aggregate_throughput_of_concurrent_streams() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(3):  # four overlapping streams, each decoding at 40 tokens/s
        tickets = [stats.attempt_started("b300") for _ in range(4)]
        started = clock.now
        clock.advance(10.0)
        for ticket in tickets:
            done = attempt("b300", started, ttft_s=1.0, completion_tokens=361, tokens_per_s=40.0)
            stats.attempt_finished(ticket, done, "kimi-k3")
        clock.advance(5.0)  # idle stretches do not dilute the concurrency while busy
    view = stats.view("b300")
    assert view.decode_tokens_per_s == pytest.approx(40.0)
    assert view.busy_concurrency == pytest.approx(4.0)
    assert view.aggregate_tokens_per_s == pytest.approx(160.0)


def test_other_clients_on_the_pool_count_through_load_signals() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    serve(stats, clock, "b300", tokens_per_s=30.0)
    stats.update_signals("b300", LoadSignals(scraped_at=clock.now, running=8, waiting=0))
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.busy_concurrency == pytest.approx(8.0)
    assert view.aggregate_tokens_per_s == pytest.approx(240.0)
    assert view.signals is not None and view.signals.running == 8


def test_a_full_llama_cpp_server_caps_concurrency_at_its_slots() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    stats.update_signals("a100", LoadSignals(scraped_at=clock.now, running=4, slots_total=1))
    serve(stats, clock, "a100", tokens_per_s=9.0)
    assert stats.view("a100").aggregate_tokens_per_s == pytest.approx(9.0)


def test_inflight_integral_gives_average_concurrency_over_any_interval() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    first = stats.attempt_started("b300")
    before = stats.inflight_seconds("b300")
    clock.advance(2.0)
    second = stats.attempt_started("b300")
    clock.advance(2.0)
    assert stats.view("b300").inflight == 2
    stats.attempt_finished(first, attempt("b300", clock.now - 4.0), "kimi-k3")
    stats.attempt_finished(second, attempt("b300", clock.now - 2.0), "kimi-k3")
    clock.advance(4.0)
    average = (stats.inflight_seconds("b300") - before) / 8.0
    assert average == pytest.approx((1 * 2 + 2 * 2) / 8.0)
    assert stats.view("b300").inflight == 0


def test_error_and_timeout_rates_and_timeouts_count_as_slow() -> None:
    clock = FakeClock()
    stats = LiveStats(clock, half_life_s=1e9)  # no decay: plain shares
    for _ in range(6):
        serve(stats, clock, "a100", ttft_s=8.0)
    for _ in range(2):
        serve(stats, clock, "a100", ttft_s=None, status="timeout", failed_after_s=120.0)
    for _ in range(2):
        serve(stats, clock, "a100", status="upstream_error", http_status=502)
    serve(stats, clock, "a100", status="upstream_error", http_status=400)  # the client's fault
    view = stats.view("a100")
    assert view.error_rate == pytest.approx(4 / 11, rel=0.05)
    assert view.timeout_rate == pytest.approx(2 / 11, rel=0.05)
    assert view.ttft_p95_s == pytest.approx(120.0)  # a timeout is at least this slow


def test_views_are_cached_until_something_changes() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    serve(stats, clock, "b300")
    first = stats.view("b300")
    assert stats.view("b300") is first
    clock.advance(60.0)
    assert stats.view("b300") is first  # time alone changes nothing measured
    stats.set_health("b300", False, booting=True)
    booting = stats.view("b300")
    assert booting is not first and booting.booting and not stats.allows_request("b300")


def test_quantiles_are_recomputed_at_most_every_refresh_interval() -> None:
    clock = FakeClock()
    stats = LiveStats(clock, refresh_s=0.1)
    serve(stats, clock, "b300", ttft_s=1.0)
    assert stats.view("b300").samples == 1  # the first sample shows at once
    ticket = stats.attempt_started("b300")
    stats.attempt_finished(ticket, attempt("b300", clock.now - 2.0, ttft_s=2.0), "kimi-k3")
    assert stats.view("b300").samples == 1
    clock.advance(0.1)
    view = stats.view("b300")
    assert view.samples == 2 and view.ttft_p95_s == pytest.approx(2.0)


def test_stale_load_signals_are_dropped_from_views() -> None:
    clock = FakeClock()
    stats = LiveStats(clock, signals_stale_after_s=5.0)
    stats.update_signals("b300", LoadSignals(scraped_at=clock.now, running=3, waiting=7))
    assert stats.view("b300").signals is not None
    clock.advance(5.0)
    assert stats.view("b300").signals is None


def test_snapshot_covers_asked_backends_including_never_seen_ones() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    serve(stats, clock, "b300")
    snapshot = stats.snapshot(["b300", "api"])
    assert set(snapshot) == {"b300", "api"}
    assert snapshot["b300"].samples == 1 and snapshot["api"].samples == 0


def test_a_built_view_is_a_frozen_backend_view_like_any_other() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    serve(stats, clock, "b300", ttft_s=0.7)
    view = stats.view("b300")
    assert type(view) is BackendView  # built as a draft with the same slots, then turned into one
    same = BackendView(**{f.name: getattr(view, f.name) for f in fields(BackendView)})
    assert view == same and repr(view) == repr(same)
    with pytest.raises(FrozenInstanceError):
        view.inflight = 3  # type: ignore[misc]
    assert replace(view, inflight=3).inflight == 3 and view.inflight == 0


def test_learned_output_lengths_follow_each_answer_in_the_views() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    serve(stats, clock, "b300", completion_tokens=100)
    first = stats.view("b300")
    clock.advance(1.0)
    serve(stats, clock, "b300", completion_tokens=300)
    second = stats.view("b300")
    assert first.learned_completion_tokens("kimi-k3") == 100.0
    assert 100.0 < (second.learned_completion_tokens("kimi-k3") or 0.0) < 300.0
    assert first.learned_completion_tokens("kimi-k3") == 100.0  # an older view keeps what it showed


def test_decayed_mean_without_time_passing_is_a_plain_mean() -> None:
    mean = DecayedMean(half_life_s=10.0)
    assert mean.value is None
    mean.add(5.0, 1.0)
    mean.add(5.0, 0.0)
    mean.add(4.0, 0.0)  # an older value counts as a new one, undecayed
    assert mean.value == pytest.approx(1 / 3)


def test_a_quantile_of_one_is_the_largest_sample() -> None:
    samples = DecayedSamples(window=8, half_life_s=60.0)
    for at, value in enumerate((3.0, 1.0, 2.0)):
        samples.add(float(at), value)
    assert samples.quantiles(0.0, 1.0) == (1.0, 3.0)
