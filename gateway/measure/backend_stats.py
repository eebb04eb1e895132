"""One backend's live measurements (``BackendStats``) and the frozen ``BackendView`` a decision reads of
them: time-decayed TTFT quantiles, speeds, error rates, in-flight concurrency. ``stats.py``'s
``LiveStats`` holds one per backend and feeds them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from types import MappingProxyType
from typing import Any, Protocol, cast

from gateway.measure.decayed import DecayedMean, DecayedSamples
from gateway.measure.health import CircuitBreaker, CircuitState, is_backend_failure
from gateway.measure.recovery import SpellWatch
from gateway.measure.signals import LoadSignals
from gateway.values.observation import Attempt

_NO_ROUTES: Mapping[str, float] = MappingProxyType({})
PREFILL_MIN_TOKENS = 8000  # uncached prompt tokens from which an attempt's TTFT is mostly prefill


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


def _compiled(cls: type) -> bool:
    return hasattr(cls, "__mypyc_attrs__")  # what mypyc gives every class it compiles


# A frozen dataclass's __init__ sets each of the 25 fields through object.__setattr__ (~5.5 us a view,
# built ~5 times per simulated request). Interpreted, ``BackendStats.view`` builds an unfrozen twin
# with the same slots in the same order (plain attribute stores, ~0.5 us) and turns it into a
# BackendView: the layouts are the same, so Python allows the ``__class__`` assignment, and the result
# is a BackendView like any other (frozen, equal to one built the usual way). Compiled
# (gateway/native.py), BackendView's own constructor stores the fields straight into its struct.
_ViewDraft: Any = None
if not _compiled(BackendView):
    _ViewDraft = make_dataclass(
        "_ViewDraft",
        [
            (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
            for f in fields(BackendView)
        ],
        slots=True,
        eq=False,
        repr=False,
    )
    if _ViewDraft.__slots__ != cast(Any, BackendView).__slots__:  # what the __class__ assignment relies on
        raise TypeError("_ViewDraft must have BackendView's slots in the same order")


def _view_through_draft(*fields_in_order: Any) -> BackendView:
    view = _ViewDraft(*fields_in_order)
    view.__class__ = BackendView
    return cast(BackendView, view)


new_view: Callable[..., BackendView] = BackendView if _compiled(BackendView) else _view_through_draft


def backend_state(view: BackendView, scraped: Mapping[str, object] | None) -> str:
    """One word for /ready: "ok", "booting", "down" (health check failing), "circuit_open", or
    "unknown" (its health check has not answered yet)."""
    if view.booting:
        return "booting"
    if scraped is not None and scraped.get("healthy") is None:
        return "unknown"
    if not view.healthy:
        return "down"
    return "ok" if view.circuit != "open" else "circuit_open"


class Owner(Protocol):
    """The settings a backend's stats read from the ``LiveStats`` that holds them."""

    clock: Callable[[], float]
    half_life_s: float
    window: int
    refresh_s: float
    signals_stale_after_s: float


class BackendStats:
    """Mutable measurements of one backend; builds a fresh view only when something changed."""

    def __init__(self, name: str, owner: Owner, breaker: CircuitBreaker) -> None:
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
        self.completion_view: Mapping[str, float] | None = None  # of ``completion_tokens``; None: stale
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
                self.completion_view = None

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

    def fresh_signals(self, now: float) -> tuple[LoadSignals | None, float]:
        """The scraped signals while they are fresh (None once stale), and when they go stale
        (``math.inf``: nothing to go stale)."""
        signals = self.signals
        if signals is None:
            return None, math.inf
        stale_at = signals.scraped_at + self.owner.signals_stale_after_s
        return (None, math.inf) if now >= stale_at else (signals, stale_at)

    def pause_at(self, now: float) -> float | None:
        """When an upstream's rate-limit pause ends, while it lasts; None when not paused."""
        paused_until = self.paused_until
        return paused_until if paused_until is not None and paused_until > now else None

    def wakes_at(self, now: float) -> float:
        """The next moment its circuit turns half-open or its pause ends, with nothing fed in
        (``math.inf``: neither is ahead)."""
        at = math.inf
        half_open_at = self.breaker.half_open_at
        if half_open_at is not None and half_open_at > now:
            at = half_open_at
        paused_until = self.paused_until
        if paused_until is not None and now < paused_until < at:
            at = paused_until
        return at

    def view(self, now: float) -> BackendView:
        if self.cached_view is not None and not self.changed and now < self.next_check_at:
            return self.cached_view
        self.summarize(now)
        signals, stale_at = self.fresh_signals(now)
        decode = self.decode_tps.value
        concurrency = self.busy_concurrency(now)
        completion = self.completion_view
        if completion is None:  # a decayed mean's value changes only when a value is added
            completion = self.completion_view = MappingProxyType(
                {
                    route: mean.value
                    for route, mean in self.completion_tokens.items()
                    if mean.value is not None
                }
            )
        paused_until = self.pause_at(now)
        breaker = self.breaker
        quantiles = self.quantiles
        view = new_view(  # positional, in field order: keywords cost ~1 us a view
            self.name,  # name
            self.summarized_samples,  # samples
            self.last_sample_at,  # last_sample_at
            quantiles[0],  # ttft_p50_s
            quantiles[1],  # ttft_p95_s
            quantiles[2],  # first_answer_p50_s
            quantiles[3],  # first_answer_p95_s
            decode,  # decode_tokens_per_s
            None if decode is None else decode * concurrency,  # aggregate_tokens_per_s
            concurrency,  # busy_concurrency
            self.service_time.value,  # service_time_s
            self.inflight + self.remote_inflight,  # inflight
            self.errors.value or 0.0,  # error_rate
            self.timeouts.value or 0.0,  # timeout_rate
            breaker.state,  # circuit
            breaker.allows_request(),  # accepts_requests
            self.healthy,  # healthy
            self.booting,  # booting
            signals,  # signals
            paused_until,  # paused_until
            self.prefill_tps.value,  # prefill_tokens_per_s
            self.probes,  # probes
            self.last_probe_at,  # last_probe_at
            self.last_user_sample_at,  # last_user_sample_at
            completion,  # completion_tokens_by_route
        )
        self.cached_view = view
        self.changed = False
        # The next moment this view may go out of date with nothing fed in: a circuit's cooldown
        # ends, signals go stale, pending samples are due, or busy concurrency drifts.
        next_check = min(stale_at, self.wakes_at(now))
        refresh_s = self.owner.refresh_s
        if self.samples_pending:
            next_check = min(next_check, self.summarized_at + refresh_s)
        if self.inflight + self.remote_inflight > 0:
            next_check = min(next_check, now + refresh_s)
        self.next_check_at = next_check
        return self.cached_view
