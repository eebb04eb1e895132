"""``LiveStats.probe_view`` (what the simulator's prober reads, without building a view) reads what
``LiveStats.view`` would show in every field the probe plan reads, whatever state the backend is in: fed
answers, a probe in flight, a circuit opened by failures, a rate-limit pause, fresh and stale signals,
down and booting. Two readings of one state kept apart would let the simulator's probes drift from the
gateway's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.measure.signals import LoadSignals
from gateway.measure.stats import LiveStats, ProbeView
from gateway.values.observation import Attempt, Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answered(stats: LiveStats, clock: Clock, ttft_s: float = 0.5) -> None:
    ticket = stats.attempt_started("b")
    started = clock.now
    clock.now += 2.0
    attempt = Attempt(
        "b", started, ttft_s=ttft_s, first_answer_s=ttft_s, finished_at=clock.now, token_chunks=90
    )
    attempt.usage = Usage(100, 90)
    stats.attempt_finished(ticket, attempt, "r")


def failed(stats: LiveStats, clock: Clock) -> None:
    ticket = stats.attempt_started("b")
    clock.now += 0.1
    stats.attempt_finished(
        ticket, Attempt("b", clock.now - 0.1, status="upstream_error", finished_at=clock.now), "r"
    )


def plan_fields(view: object) -> ProbeView:
    return ProbeView(*(getattr(view, name) for name in ProbeView._fields))


def fresh(stats: LiveStats, clock: Clock) -> None:
    pass


def many_answers(stats: LiveStats, clock: Clock) -> None:
    for i in range(30):
        answered(stats, clock, 0.2 + i / 10)


def probe_in_flight(stats: LiveStats, clock: Clock) -> None:
    stats.attempt_started("b", probe=True)


def circuit_opened(stats: LiveStats, clock: Clock) -> None:
    for _ in range(20):
        failed(stats, clock)


def paused(stats: LiveStats, clock: Clock) -> None:
    stats.pause("b", clock.now + 30.0)


def pause_over(stats: LiveStats, clock: Clock) -> None:
    stats.pause("b", clock.now + 1.0)
    clock.now += 5.0


def signals(stats: LiveStats, clock: Clock) -> None:
    stats.update_signals("b", LoadSignals(scraped_at=clock.now, running=3, waiting=1))


def stale_signals(stats: LiveStats, clock: Clock) -> None:
    signals(stats, clock)
    clock.now += 60.0


def remote_in_flight(stats: LiveStats, clock: Clock) -> None:
    stats.set_remote_inflight("b", 4)  # another replica's requests


def down(stats: LiveStats, clock: Clock) -> None:
    stats.set_health("b", False)


def booting(stats: LiveStats, clock: Clock) -> None:
    stats.set_health("b", True, booting=True)


STATES: list[Callable[[LiveStats, Clock], None]] = [
    fresh, many_answers, probe_in_flight, circuit_opened, paused, pause_over, signals, stale_signals,
    remote_in_flight, down, booting,
]  # fmt: skip


@pytest.mark.parametrize("state", STATES, ids=[state.__name__ for state in STATES])
def test_the_probe_view_reads_what_the_view_shows(state: Callable[[LiveStats, Clock], None]) -> None:
    clock = Clock()
    stats = LiveStats(clock)
    answered(stats, clock)
    state(stats, clock)
    clock.now += 0.25
    assert stats.probe_view("b") == plan_fields(stats.view("b"))
