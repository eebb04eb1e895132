"""Live per-backend measurements from real traffic (this replica's, and the fleet's merged in): time-
decayed TTFT quantiles, speeds, error rates. Decisions read cheap frozen ``BackendView`` snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.measure.decayed import DecayedMean, DecayedSamples
from gateway.measure.health import CircuitBreaker, CircuitState, is_backend_failure
from gateway.measure.recovery import NOT_EXCLUDED, RecoveryBar, SpellWatch
from gateway.measure.signals import LoadSignals
from gateway.request.observation import Attempt

_NO_ROUTES: Mapping[str, float] = MappingProxyType({})
PREFILL_MIN_TOKENS = 8000  # uncached prompt tokens from which an attempt's TTFT is mostly prefill


@dataclass(frozen=True, slots=True)
class AttemptTicket:
    """Handed out when an attempt starts, handed back when it ends."""

    backend: str
    started_at: float
    probe: bool  # the one request a half-open circuit lets through


@dataclass(frozen=True, slots=True)
class BackendView:
    """What a decision may know about one backend at one moment; never changes once built."""

    name: str
    samples: int = 0  # TTFT samples in the window; 0 means unmeasured
    last_sample_at: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    first_answer_p50_s: float | None = None
    first_answer_p95_s: float | None = None
    decode_tokens_per_s: float | None = None  # per stream
    aggregate_tokens_per_s: float | None = None  # whole pool, while busy
    busy_concurrency: float = 1.0  # average streams while busy, at least 1
    service_time_s: float | None = None  # mean duration of a successful attempt
    inflight: int = 0
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    circuit: CircuitState = "closed"
    accepts_requests: bool = True  # circuit closed, or half-open with its probe slot free
    healthy: bool = True
    booting: bool = False
    signals: LoadSignals | None = None  # None when never scraped or stale
    paused_until: float | None = None  # an upstream 429's Retry-After: no attempt before then
    prefill_tokens_per_s: float | None = None  # prompt tokens processed per second (long prompts)
    probes: int = 0  # synthetic probes this backend has answered (gateway/probes.py)
    last_probe_at: float | None = None
    last_user_sample_at: float | None = None  # the newest TTFT sample of a user's request
    completion_tokens_by_route: Mapping[str, float] = field(default_factory=lambda: _NO_ROUTES)

    def learned_completion_tokens(self, route: str) -> float | None:
        return self.completion_tokens_by_route.get(route)


class _BackendStats:
    """Mutable measurements of one backend; builds a fresh view only when something changed."""

    def __init__(self, name: str, owner: LiveStats, breaker: CircuitBreaker) -> None:
        half_life, window = owner.half_life_s, owner.window
        self.name = name
        self.owner = owner
        self.breaker = breaker
        self.ttft = DecayedSamples(window, half_life)
        self.first_answer = DecayedSamples(window, half_life)
        self.decode_tps = DecayedMean(half_life)
        self.service_time = DecayedMean(half_life)
        self.errors = DecayedMean(half_life)
        self.timeouts = DecayedMean(half_life)
        self.signal_running = DecayedMean(half_life)
        self.prefill_tps = DecayedMean(half_life)
        self.paused_until: float | None = None
        self.probes = 0
        self.last_probe_at: float | None = None
        self.last_user_sample_at: float | None = None
        self.spell = SpellWatch()  # a slow spell's end, from answers within the excluding routes' SLOs
        self.completion_tokens: dict[str, DecayedMean] = {}
        self.healthy = True
        self.booting = False
        self.signals: LoadSignals | None = None
        self.last_sample_at: float | None = None
        # In-flight accounting: an exact running integral, and a decayed one over busy time only.
        self.inflight = 0
        self.probing = 0  # of ``inflight``, synthetic probes: they hold a slot but decode nothing
        self.remote_inflight = 0  # other replicas' attempts in flight, as they last said
        self.inflight_seconds = 0.0
        self.busy_area = 0.0
        self.busy_time = 0.0
        self.integrated_at = owner.clock()
        # View cache: quantiles are the only costly part, so they are recomputed at most every
        # ``refresh_s``; everything else is rebuilt whenever it changed.
        self.quantiles: tuple[float | None, ...] = (None, None, None, None)
        self.summarized_samples = 0
        self.summarized_at = -math.inf
        self.samples_pending = False
        self.changed = True
        self.next_check_at = -math.inf
        self.cached_view: BackendView | None = None

    def integrate(self, now: float) -> None:
        elapsed = now - self.integrated_at
        if elapsed <= 0:
            return
        self.inflight_seconds += self.inflight * elapsed
        decay = 0.5 ** (elapsed / self.owner.half_life_s)
        self.busy_area *= decay
        self.busy_time *= decay
        fleet = self.inflight - self.probing + self.remote_inflight
        if fleet > 0:
            self.busy_area += fleet * elapsed
            self.busy_time += elapsed
        self.integrated_at = now

    def record(self, attempt: Attempt, route: str, now: float) -> None:
        ttft, first_answer = attempt.ttft_s, attempt.first_answer_s
        from_spell = attempt.started_at < self.spell.over_at
        if from_spell:
            ttft = first_answer = None
        if attempt.status == "timeout" and attempt.duration_s is not None:
            # A timeout is a lower bound on the latency: count it, or a hanging backend looks fast.
            ttft = ttft if ttft is not None else attempt.duration_s
            first_answer = first_answer if first_answer is not None else attempt.duration_s
        if ttft is not None:
            self.ttft.add(now, ttft)
            self.last_sample_at = now
            self.samples_pending = True
            if not attempt.probe:
                self.last_user_sample_at = now
        if first_answer is not None:
            self.first_answer.add(now, first_answer)
            self.samples_pending = True
        failed = is_backend_failure(attempt)
        if failed is not None:
            self.errors.add(now, 1.0 if failed else 0.0)
            self.timeouts.add(now, 1.0 if attempt.status == "timeout" else 0.0)
        if attempt.probe:
            self.probes += 1
            self.last_probe_at = now
            return  # a one-token probe teaches TTFT and health, not speeds or output lengths
        if attempt.status == "ok":
            usage = attempt.usage
            if usage is not None and ttft is not None and ttft > 0:
                uncached = usage.prompt_tokens - usage.cached_prompt_tokens
                if uncached >= PREFILL_MIN_TOKENS:  # short prompts: TTFT is mostly overhead
                    self.prefill_tps.add(now, uncached / ttft)
            tps = None if from_spell else attempt.decode_tokens_per_s
            if tps is not None:
                self.decode_tps.add(now, tps)
            if attempt.duration_s is not None:
                self.service_time.add(now, attempt.duration_s)
            if attempt.usage is not None:
                mean = self.completion_tokens.get(route)
                if mean is None:
                    mean = self.completion_tokens[route] = DecayedMean(self.owner.half_life_s)
                mean.add(now, attempt.usage.completion_tokens)

    def user_answered(self, attempt: Attempt) -> None:
        """A user's answer from a backend that routes exclude counts toward its recovery like a probe."""
        self.judge_recovery(self.spell.user_answered(attempt))

    def judge_recovery(self, over_at: float | None) -> None:
        """When the spell is over (``over_at``, from ``SpellWatch``), the samples from before it stop
        counting; the decode speed is what the answers that ended it measured."""
        self.changed = True
        if over_at is None:
            return
        self.ttft.forget_before(over_at + 1e-9)  # a sample recorded as the first answer left is old
        self.first_answer.forget_before(over_at + 1e-9)
        speeds = self.spell.take_speeds()
        if speeds:
            self.decode_tps = DecayedMean(self.owner.half_life_s)
            for speed in speeds:
                self.decode_tps.add(self.owner.clock(), speed)
        self.summarized_at = -math.inf
        self.samples_pending = True

    def busy_concurrency(self, now: float) -> float:
        """Average streams while busy, counting the current stretch; other clients' via signals."""
        area, busy = self.busy_area, self.busy_time
        elapsed = now - self.integrated_at
        if elapsed > 0:
            decay = 0.5 ** (elapsed / self.owner.half_life_s)
            area, busy = area * decay, busy * decay
            fleet = self.inflight - self.probing + self.remote_inflight
            if fleet > 0:
                area += fleet * elapsed
                busy += elapsed
        own = area / busy if busy > 0 else 1.0
        concurrency = max(own, self.signal_running.value or 1.0, 1.0)
        # Requests queued behind a full llama.cpp server are in flight but not decoding.
        slots = self.signals.slots_total if self.signals is not None else None
        return min(concurrency, float(slots)) if slots else concurrency

    def summarize(self, now: float) -> None:
        """Refresh the latency quantiles from the samples, at most once per ``refresh_s``."""
        if self.samples_pending and (
            now - self.summarized_at >= self.owner.refresh_s or self.summarized_samples == 0
        ):
            self.quantiles = (self.ttft.quantiles(0.5, 0.95) or (None, None)) + (
                self.first_answer.quantiles(0.5, 0.95) or (None, None)
            )
            self.summarized_samples = len(self.ttft)
            self.summarized_at = now
            self.samples_pending = False

    def view(self, now: float) -> BackendView:
        if self.cached_view is not None and not self.changed and now < self.next_check_at:
            return self.cached_view
        self.summarize(now)
        signals = self.signals
        stale_at = math.inf
        if signals is not None:
            stale_at = signals.scraped_at + self.owner.signals_stale_after_s
            if now >= stale_at:
                signals, stale_at = None, math.inf
        decode = self.decode_tps.value
        concurrency = self.busy_concurrency(now)
        self.cached_view = BackendView(
            name=self.name,
            samples=self.summarized_samples,
            last_sample_at=self.last_sample_at,
            ttft_p50_s=self.quantiles[0],
            ttft_p95_s=self.quantiles[1],
            first_answer_p50_s=self.quantiles[2],
            first_answer_p95_s=self.quantiles[3],
            decode_tokens_per_s=decode,
            aggregate_tokens_per_s=None if decode is None else decode * concurrency,
            busy_concurrency=concurrency,
            service_time_s=self.service_time.value,
            inflight=self.inflight + self.remote_inflight,
            error_rate=self.errors.value or 0.0,
            timeout_rate=self.timeouts.value or 0.0,
            circuit=self.breaker.state,
            accepts_requests=self.breaker.allows_request(),
            healthy=self.healthy,
            booting=self.booting,
            signals=signals,
            paused_until=self.paused_until
            if self.paused_until is not None and self.paused_until > now
            else None,
            prefill_tokens_per_s=self.prefill_tps.value,
            probes=self.probes,
            last_probe_at=self.last_probe_at,
            last_user_sample_at=self.last_user_sample_at,
            completion_tokens_by_route=MappingProxyType(
                {
                    route: mean.value
                    for route, mean in self.completion_tokens.items()
                    if mean.value is not None
                }
            ),
        )
        self.changed = False
        # The next moment this view may go out of date with nothing fed in: a circuit's cooldown
        # ends, signals go stale, pending samples are due, or busy concurrency drifts.
        next_check = stale_at
        refresh_s = self.owner.refresh_s
        half_open_at = self.breaker.half_open_at
        if half_open_at is not None and half_open_at > now:
            next_check = min(next_check, half_open_at)
        if self.paused_until is not None and self.paused_until > now:
            next_check = min(next_check, self.paused_until)
        if self.samples_pending:
            next_check = min(next_check, self.summarized_at + refresh_s)
        if self.inflight + self.remote_inflight > 0:
            next_check = min(next_check, now + refresh_s)
        self.next_check_at = next_check
        return self.cached_view


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
        self._backends: dict[str, _BackendStats] = {}

    def _stats(self, backend: str) -> _BackendStats:
        stats = self._backends.get(backend)
        if stats is None:
            stats = self._backends[backend] = _BackendStats(backend, self, self._make_breaker(self.clock))
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
        paused = stats.paused_until is not None and stats.paused_until > self.clock()
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

    def circuit(self, backend: str) -> CircuitBreaker:
        return self._stats(backend).breaker

    def inflight_seconds(self, backend: str) -> float:
        """Exact ∫ in-flight dt since start; the average concurrency over [t1, t2] is the difference
        of two readings divided by t2 - t1."""
        stats = self._stats(backend)
        return stats.inflight_seconds + stats.inflight * max(0.0, self.clock() - stats.integrated_at)

    def view(self, backend: str) -> BackendView:
        return self._stats(backend).view(self.clock())

    def ttft_p50_s(self, backend: str) -> float | None:
        """The view's ``ttft_p50_s`` without building a view (once per non-streamed answer)."""
        stats = self._stats(backend)
        stats.summarize(self.clock())
        return stats.quantiles[0]

    def snapshot(self, backends: Iterable[str]) -> Mapping[str, BackendView]:
        now = self.clock()
        return {name: self._stats(name).view(now) for name in backends}
