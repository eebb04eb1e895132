"""Circuit breaking with a fake clock: open after failures, half-open after a cooldown, probe, close."""

from __future__ import annotations

from gateway.measure.health import CircuitBreaker, is_backend_failure
from gateway.measure.stats import LiveStats
from tests.unit.factories import FakeClock, attempt, serve


def state(breaker: CircuitBreaker) -> str:
    """Read afresh each time (mypy would otherwise narrow the property to its first value)."""
    return breaker.state


def _fail(breaker: CircuitBreaker, clock: FakeClock, *, probe: bool = False) -> None:
    breaker.record(attempt("b", clock.now, status="connect_error"), probe=probe)


def _succeed(breaker: CircuitBreaker, clock: FakeClock, *, probe: bool = False) -> None:
    breaker.record(attempt("b", clock.now), probe=probe)


def test_opens_after_five_consecutive_failures() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(4):
        _fail(breaker, clock)
    assert state(breaker) == "closed"
    _succeed(breaker, clock)  # a success in between resets the streak
    for _ in range(4):
        _fail(breaker, clock)
    assert state(breaker) == "closed" and breaker.allows_request()
    _fail(breaker, clock)
    assert state(breaker) == "open" and breaker.state_code == 1
    assert not breaker.allows_request()


def test_half_open_lets_one_probe_through_and_its_success_closes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(5):
        _fail(breaker, clock)
    clock.advance(0.9)
    assert state(breaker) == "open"
    clock.advance(0.1)
    assert state(breaker) == "half_open" and breaker.state_code == 2
    assert breaker.allows_request()
    assert breaker.attempt_started() is True
    assert not breaker.allows_request()  # one probe at a time
    assert breaker.attempt_started() is False
    _succeed(breaker, clock, probe=True)
    assert state(breaker) == "closed" and breaker.state_code == 0


def test_probe_failure_reopens_with_doubling_cooldown_capped_at_30s() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(5):
        _fail(breaker, clock)
    cooldowns = []
    for _ in range(7):
        opened_at = clock.now
        half_open_at = breaker.half_open_at
        assert half_open_at is not None
        cooldowns.append(half_open_at - opened_at)
        clock.now = half_open_at
        assert breaker.attempt_started()
        _fail(breaker, clock, probe=True)
        assert state(breaker) == "open"
    assert cooldowns == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_late_results_of_old_attempts_do_not_decide_a_half_open_circuit() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(5):
        _fail(breaker, clock)
    clock.advance(1.0)
    _succeed(breaker, clock)  # sent before the circuit opened
    assert state(breaker) == "half_open"


def test_cancelled_probe_frees_the_probe_slot() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(5):
        _fail(breaker, clock)
    clock.advance(1.0)
    assert breaker.attempt_started()
    breaker.record(attempt("b", clock.now, status="cancelled"), probe=True)
    assert state(breaker) == "half_open" and breaker.allows_request()


def test_client_errors_are_not_backend_failures() -> None:
    assert is_backend_failure(attempt("b", 0.0, status="upstream_error", http_status=400)) is False
    # A rate limit is backpressure: it pauses the backend (LiveStats.pause), never opens its circuit.
    assert is_backend_failure(attempt("b", 0.0, status="upstream_error", http_status=429)) is None
    assert is_backend_failure(attempt("b", 0.0, status="upstream_error", http_status=503)) is True
    assert is_backend_failure(attempt("b", 0.0, status="timeout")) is True
    assert is_backend_failure(attempt("b", 0.0, status="cancelled")) is None


def test_high_failure_rate_opens_without_a_streak() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(8):  # fail, fail, ok: 2/3 failures but never 5 in a row
        _fail(breaker, clock)
        _fail(breaker, clock)
        _succeed(breaker, clock)
        clock.advance(0.1)
        if state(breaker) == "open":
            break
    assert state(breaker) == "open"


def test_health_recovery_closes_an_open_circuit_but_steady_health_does_not() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock)
    for _ in range(5):
        _fail(breaker, clock)
    breaker.health_reported(True, recovered=False)
    assert state(breaker) == "open"
    breaker.health_reported(True, recovered=True)
    assert state(breaker) == "closed"


def test_live_stats_opens_the_circuit_of_a_single_backend_and_recovers_it_through_health() -> None:
    clock = FakeClock()
    stats = LiveStats(clock)
    for _ in range(5):
        serve(stats, clock, "solo", status="connect_error")
    view = stats.view("solo")
    assert view.circuit == "open" and not view.accepts_requests
    assert not stats.allows_request("solo")
    clock.advance(1.0)  # the cooldown ends with nothing fed in: the cached view must notice
    assert stats.view("solo").circuit == "half_open"
    stats.set_health("solo", False)
    stats.set_health("solo", True)
    view = stats.view("solo")
    assert view.circuit == "closed" and view.healthy and stats.allows_request("solo")
