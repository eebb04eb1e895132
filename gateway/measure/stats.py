"""Live per-backend measurements from real traffic (this replica's, and the fleet's merged in), fed by
the request path, the signal scraper, health checks and probes. Each backend's own measurements and the
frozen ``BackendView`` snapshots that decisions read are ``backend_stats.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gateway.measure.backend_stats import BackendStats, BackendView
from gateway.measure.health import CircuitBreaker, CircuitState
from gateway.measure.recovery import NOT_EXCLUDED, RecoveryBar
from gateway.measure.signals import LoadSignals
from gateway.values.observation import Attempt


@dataclass(frozen=True, slots=True)
class AttemptTicket:
    """Handed out when an attempt starts, handed back when it ends."""

    backend: str
    started_at: float
    probe: bool  # the one request a half-open circuit lets through


class ProbeView(NamedTuple):
    """The fields of a backend's view that the probe plan reads (``probe_plan.PlanView``), as
    ``LiveStats.probe_view`` reads them without building a view; equal when the plan would read the same."""

    healthy: bool
    booting: bool
    inflight: int
    paused_until: float | None
    circuit: CircuitState
    accepts_requests: bool
    last_probe_at: float | None
    last_user_sample_at: float | None
    signals: LoadSignals | None
    ttft_p95_s: float | None
    decode_tokens_per_s: float | None


_tuple_new: Callable[[type[ProbeView], tuple[object, ...]], ProbeView] = tuple.__new__


class LiveStats:
    """Every backend's live measurements, fed by the request path, the signal scraper and health checks.

    ``clock`` returns seconds; inject a fake one to drive it in virtual time.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        half_life_s: float = 60.0,
        window: int = 256,
        refresh_s: float = 0.1,
        signals_stale_after_s: float = 10.0,
        make_breaker: Callable[[Callable[[], float]], CircuitBreaker] = CircuitBreaker,
    ) -> None:
        self.clock = clock
        self.half_life_s = half_life_s
        self.window = window
        self.refresh_s = refresh_s
        self.signals_stale_after_s = signals_stale_after_s
        self._make_breaker = make_breaker
        self._backends: dict[str, BackendStats] = {}

    def _stats(self, backend: str) -> BackendStats:
        stats = self._backends.get(backend)
        if stats is None:
            stats = self._backends[backend] = BackendStats(backend, self, self._make_breaker(self.clock))
        return stats

    def attempt_started(self, backend: str, *, probe: bool = False) -> AttemptTicket:
        stats = self._stats(backend)
        now = self.clock()
        stats.integrate(now)
        stats.inflight += 1
        stats.probing += probe
        stats.changed = True
        return AttemptTicket(backend, now, probe=stats.breaker.attempt_started())

    def attempt_finished(self, ticket: AttemptTicket, attempt: Attempt, route: str) -> None:
        """Call exactly once per ticket, in a ``finally``: in-flight counts and probes depend on it."""
        stats = self._stats(ticket.backend)
        now = self.clock()
        stats.integrate(now)
        stats.inflight = max(0, stats.inflight - 1)
        stats.record(attempt, route, now)
        stats.breaker.record(attempt, probe=ticket.probe)
        stats.changed = True
        stats.user_answered(attempt)

    def update_signals(self, backend: str, signals: LoadSignals) -> None:
        stats = self._stats(backend)
        stats.signals = signals
        if signals.running is not None:
            # Other clients may share the pool: the backend's own count of running streams is the
            # truer concurrency, but it cannot be below what this gateway alone has in flight.
            running = max(signals.running, stats.inflight + stats.remote_inflight)
            if running >= 1:
                stats.signal_running.add(signals.scraped_at, running)
        stats.changed = True

    def merge_remote(self, attempt: Attempt, route: str, at: float) -> None:
        """Another replica's finished attempt (``at`` on this clock): it teaches the same things as
        one of ours, except to the circuit breaker, which follows the other replica's own verdicts."""
        stats = self._stats(attempt.backend)
        stats.record(attempt, route, at)
        stats.changed = True
        stats.user_answered(attempt)

    def set_remote_inflight(self, backend: str, inflight: int) -> None:
        stats = self._stats(backend)
        if stats.remote_inflight != inflight:
            stats.integrate(self.clock())
            stats.remote_inflight = inflight
            stats.changed = True

    def local_inflight(self, backend: str) -> int:
        """This replica's own attempts in flight (views show the fleet's)."""
        return self._stats(backend).inflight

    def adopt_circuit(self, backend: str, state: CircuitState, cooldown_s: float, left_s: float) -> None:
        """Another replica's circuit for ``backend`` opened or closed: follow it."""
        stats = self._stats(backend)
        stats.breaker.adopt(state, cooldown_s, left_s)
        stats.changed = True

    def set_health(self, backend: str, healthy: bool, booting: bool = False) -> None:
        stats = self._stats(backend)
        recovered = healthy and not booting and (not stats.healthy or stats.booting)
        stats.healthy, stats.booting = healthy, booting
        stats.breaker.health_reported(healthy and not booting, recovered=recovered)
        stats.changed = True

    def allows_request(self, backend: str) -> bool:
        """Check before each fallback attempt: a circuit may have opened since the decision."""
        stats = self._stats(backend)
        paused = stats.pause_at(self.clock()) is not None
        return stats.healthy and not stats.booting and not paused and stats.breaker.allows_request()

    def pause(self, backend: str, until: float) -> None:
        """An upstream rate limit: no attempt goes to ``backend`` before ``until`` (its Retry-After).
        Backpressure, not failure: the circuit breaker never sees it."""
        stats = self._stats(backend)
        if stats.paused_until is None or until > stats.paused_until:
            stats.paused_until = until
            stats.changed = True

    def paused_for(self, backend: str) -> float:
        """Seconds until ``backend``'s rate limit pause ends; 0 when it is not paused."""
        until = self._stats(backend).paused_until
        return 0.0 if until is None else max(0.0, until - self.clock())

    def recovering(self, backend: str) -> bool:
        """Whether probes have begun to show a recovery that is not confirmed yet."""
        return self._stats(backend).spell.recovering

    def probe_finished(
        self,
        ticket: AttemptTicket,
        attempt: Attempt,
        recovery_probes: int,
        ratio: float,
        bar: RecoveryBar = NOT_EXCLUDED,
    ) -> None:
        """A synthetic probe ended. One that succeeds closes an open circuit. After ``recovery_probes``
        in a row that answer within ``bar`` (the SLOs of the routes that exclude the backend; see
        ``recovery.answered_within``), the samples from before them (a slow spell, now over) stop
        counting, and so do attempts started before them that are still running."""
        stats = self._stats(ticket.backend)
        before = stats.ttft.quantiles(0.5)  # the backend as known before this probe
        stats.integrate(self.clock())
        stats.probing = max(0, stats.probing - 1)
        self.attempt_finished(ticket, attempt, "")
        breaker = stats.breaker
        half_open_at = breaker.half_open_at
        # Sent after the circuit opened, and answered: the backend is back, let traffic through. (A
        # probe sent before the failures began says nothing about now.)
        opened_at = None if half_open_at is None else half_open_at - breaker.cooldown_s
        if attempt.status == "ok" and opened_at is not None and ticket.started_at >= opened_at:
            breaker.health_reported(True, recovered=True)
        median = None if before is None else before[0]
        stats.judge_recovery(
            stats.spell.answered(attempt, bar, median, ratio, recovery_probes, ticket.started_at)
        )

    def set_recovery_bar(self, backend: str, bar: RecoveryBar, recovery_probes: int) -> None:
        """What answers must show to end a slow spell of ``backend`` now (the prober keeps it current):
        while routes exclude it, users' answers from the traffic that still reaches it count toward
        its recovery as probes do."""
        stats = self._stats(backend)
        stats.spell.set_bar(bar, recovery_probes, self.clock())

    def recovery_bar_of(self, backend: str) -> RecoveryBar:
        """The bar ``set_recovery_bar`` set last (``NOT_EXCLUDED`` again once a spell it judged ended)."""
        return self._stats(backend).spell.bar

    def circuit(self, backend: str) -> CircuitBreaker:
        return self._stats(backend).breaker

    def inflight_seconds(self, backend: str) -> float:
        """Exact ∫ in-flight dt since start; the average concurrency over [t1, t2] is the difference
        of two readings divided by t2 - t1."""
        stats = self._stats(backend)
        return stats.inflight_seconds + stats.inflight * max(0.0, self.clock() - stats.integrated_at)

    def view(self, backend: str) -> BackendView:
        return self._stats(backend).view(self.clock())

    def probe_view(self, backend: str) -> ProbeView:
        """What the probe plan reads of ``view(backend)`` now (the same values), without building a
        view (the simulator's prober reads it four times a virtual second). New samples are
        summarized first, as a view's build would; nothing else changes."""
        stats = self._stats(backend)
        now = self.clock()
        stats.summarize(now)
        breaker = stats.breaker
        # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function (~4 ticks a second).
        return _tuple_new(
            ProbeView,
            (
                stats.healthy,
                stats.booting,
                stats.inflight + stats.remote_inflight,
                stats.pause_at(now),
                breaker.state,
                breaker.allows_request(),
                stats.last_probe_at,
                stats.last_user_sample_at,
                stats.fresh_signals(now)[0],
                stats.quantiles[1],
                stats.decode_tps.value,
            ),
        )

    def cost_speeds(self, backend: str) -> tuple[float | None, float | None]:
        """The view's aggregate and prefill speeds (what a finished attempt's cost reads), without
        building a view: the same figures ``view`` would show now."""
        stats = self._stats(backend)
        now = self.clock()
        view = stats.cached_view
        if view is not None and not stats.changed and now < stats.next_check_at:
            return view.aggregate_tokens_per_s, view.prefill_tokens_per_s
        decode = stats.decode_tps.value
        aggregate = None if decode is None else decode * stats.busy_concurrency(now)
        return aggregate, stats.prefill_tps.value

    def ttft_p50_s(self, backend: str) -> float | None:
        """The view's ``ttft_p50_s`` without building a view (once per non-streamed answer)."""
        stats = self._stats(backend)
        stats.summarize(self.clock())
        return stats.quantiles[0]

    def snapshot(self, backends: Iterable[str]) -> Mapping[str, BackendView]:
        now = self.clock()
        return {name: self._stats(name).view(now) for name in backends}
