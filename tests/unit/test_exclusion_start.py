"""A backend's exclusion ends on answers sent after it began (issue 29, found by the fidelity comparison):
an overloaded pool that routes leave when its queue pushes its p95 past their SLO still has requests in
flight, sent while it was taken. Their answers, some quick, must not end the exclusion: counted, they
made the stats forget the pool's history at once and keep only the slowest recent samples (a p95 of
5.7 s where it was 3.0), which kept it out until probes and made each run's ending a coin toss."""

from __future__ import annotations

from gateway.measure.recovery import RecoveryBar
from gateway.measure.stats import LiveStats
from tests.unit.factories import FakeClock, attempt, serve


def test_answers_in_flight_when_the_routes_left_do_not_end_the_exclusion() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(100):
        serve(stats, clock, "b300", ttft_s=1.0, completion_tokens=2)
        clock.advance(0.25)
    in_flight = [(stats.attempt_started("b300"), clock.now) for _ in range(2)]
    for _ in range(10):  # the queue those two got ahead of: slow first tokens
        serve(stats, clock, "b300", ttft_s=5.0, completion_tokens=2)
    stats.set_recovery_bar("b300", RecoveryBar(ttft_s=2.0), recovery_probes=2)  # the routes leave
    clock.advance(1.0)
    for ticket, sent_at in in_flight:
        stats.attempt_finished(ticket, attempt("b300", sent_at, ttft_s=1.0, completion_tokens=2), "kimi-k3")
    assert not stats.recovering("b300")
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.samples == 112, "the pool's history is kept: nothing new has been measured"

    # Answers sent after the routes left (another route's traffic) are new measurements: they end it.
    serve(stats, clock, "b300", route_name="batch", ttft_s=1.0, completion_tokens=2)
    assert stats.recovering("b300")
    serve(stats, clock, "b300", route_name="batch", ttft_s=1.0, completion_tokens=2)
    clock.advance(1.0)
    view = stats.view("b300")
    assert view.ttft_p95_s == 1.0 and view.samples == 2
