"""When each backend is due a synthetic probe, and what it must show: the probing rules, apart from the
sending, so the gateway's ``Prober`` and the simulator follow the same ones.

Due: every healthy backend once at start-up (and when a reload adds one or it comes back up), any
candidate of a route with an SLO that had no user's sample and no probe for ``tuning.probes.interval_s``
and nothing in flight, at once again after a probe that answered within the SLOs of the routes that
exclude it (``recovery.py``: a few of those in a row end the slow spell; users' answers from other
routes' traffic count too, so a busy backend needs no probe), and a backend whose circuit is open at
its scrape interval (a success closes the circuit); a pool only while it has headroom, a paid API only
within the budget.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.measure.backend_stats import BackendView
from gateway.measure.health import CircuitState
from gateway.measure.recovery import RecoveryBar, recovery_bar
from gateway.measure.signals import LoadSignals
from gateway.policy.compiled import CompiledBackend, CompiledPolicy

PROBE_PROMPT_TOKENS = 8
# Tokens a probe asks for when a route excludes the backend for its decode speed: enough to time the
# tokens after the first, still a fraction of a cent on a paid API.
DECODE_PROBE_TOKENS = 16
SECONDS_PER_HOUR = 3600.0


class PlanView(Protocol):
    """What ``due`` and ``quiet_until`` read of a backend: a ``BackendView`` (the gateway's prober), or
    ``stats.ProbeView``, the same fields read without building a view (the simulator's)."""

    @property
    def healthy(self) -> bool: ...
    @property
    def booting(self) -> bool: ...
    @property
    def inflight(self) -> int: ...
    @property
    def paused_until(self) -> float | None: ...
    @property
    def circuit(self) -> CircuitState: ...
    @property
    def accepts_requests(self) -> bool: ...
    @property
    def last_probe_at(self) -> float | None: ...
    @property
    def last_user_sample_at(self) -> float | None: ...
    @property
    def signals(self) -> LoadSignals | None: ...
    @property
    def ttft_p95_s(self) -> float | None: ...
    @property
    def decode_tokens_per_s(self) -> float | None: ...


ViewOf = Callable[[str], BackendView]
PlanViewOf = Callable[[str], PlanView]


@dataclass(frozen=True, slots=True)
class DueProbe:
    backend: CompiledBackend
    bar: RecoveryBar  # what it must show to end a slow spell (see recovery.py)
    max_tokens: int


class ProbePlan:
    """What has been probed and what is due, on the caller's clock."""

    def __init__(self) -> None:
        self._known: set[str] = set()
        self._pending: set[str] = set()  # probe once, as soon as healthy: start-up, added, back up
        self._down: set[str] = set()
        self._paid: deque[tuple[float, float]] = deque()  # (clock, usd) of paid probes, last hour
        self._sent_at: dict[str, float] = {}  # when each backend's last probe went out
        self._settled: set[str] = set()  # backends whose first probe since start has ended
        self.started_at: float | None = None
        self._watched: tuple[CompiledPolicy, frozenset[str]] | None = None  # the policy's, once per policy

    def set_backends(self, backends: Mapping[str, CompiledBackend], on_start: bool) -> None:
        """Follow a (re)loaded policy: backends it adds are probed once."""
        names = set(backends)
        if on_start:
            self._pending |= names - self._known
        self._pending &= names
        self._known = names

    def idle(self, inflight: Collection[str]) -> bool:
        """No probe in flight and none waiting for a healthy backend."""
        return not inflight and not (self._pending - self._down)

    def due(
        self,
        policy: CompiledPolicy,
        view_of: PlanViewOf,
        now: float,
        inflight: Collection[str],
        bars: Mapping[str, RecoveryBar] | None = None,
    ) -> list[DueProbe]:
        """The probes to send now; each is counted as sent. ``bars``: each backend's recovery bar on
        the same views, when the caller has worked them out already."""
        if self.started_at is None:
            self.started_at = now
        settings = policy.tuning.probes
        if not settings.enabled:
            return []
        watched = self._watched_backends(policy)
        chosen = []
        for name, backend in policy.backends.items():
            view = view_of(name)
            if not view.healthy or view.booting:
                self._down.add(name)
                continue
            if name in self._down:  # back up: measure it before users meet it
                self._down.discard(name)
                self._pending.add(name)
            if name in inflight or view.paused_until is not None:
                continue
            bar = bars[name] if bars is not None else None
            if bar is None:
                bar = recovery_bar(name, policy.routes.values(), view.ttft_p95_s, view.decode_tokens_per_s)
            tokens = 1 if bar.decode_tokens_per_s is None else DECODE_PROBE_TOKENS
            if view.circuit == "open":
                # Re-checked at the scrape interval, not on the circuit's growing cool-down: a probe
                # that succeeds closes it (LiveStats.probe_finished).
                last = view.last_probe_at
                due = last is None or now - last >= backend.signals.interval_s
            elif not view.accepts_requests:
                continue
            else:
                interval = settings.interval_s
                sent = self._sent_at.get(name)
                probed_lately = sent is not None and now - sent < interval
                last_user = view.last_user_sample_at
                stale = last_user is None or now - last_user >= interval
                # A backend with requests in flight is measured by them (their answers count toward
                # its recovery too: LiveStats.set_recovery_bar): only an avoided one is probed.
                avoided = stale and view.inflight == 0
                due = name in self._pending or (name in watched and not probed_lately and avoided)
            if due and self._affordable(policy, backend, view, now, tokens):
                self._pending.discard(name)
                self._sent_at[name] = now
                chosen.append(DueProbe(backend, bar, tokens))
        return chosen

    def quiet_until(
        self, policy: CompiledPolicy, view_of: PlanViewOf, now: float, inflight: Collection[str]
    ) -> float:
        """Just after ``due``: the earliest time it may choose a probe if no backend's view changes
        in between (``now`` when it may at once, e.g. one is due but not affordable yet). The
        simulator looks again only then or when a view changed; the same rules as ``due``."""
        if not policy.tuning.probes.enabled:
            return math.inf
        interval = policy.tuning.probes.interval_s
        watched = self._watched_backends(policy)
        until = math.inf
        for name, backend in policy.backends.items():
            view = view_of(name)
            if not view.healthy or view.booting:
                continue  # marked down by ``due``: a change of health changes the view
            if name in self._down or name in self._pending:
                return now
            if name in inflight or view.paused_until is not None:
                continue  # a probe's end or the pause's end changes the view
            if view.circuit == "open":
                last = view.last_probe_at
                until = min(until, now if last is None else last + backend.signals.interval_s)
            elif view.accepts_requests and name in watched and not view.inflight:
                # Not probed lately and no user's sample lately (the last request's end changes the view).
                sent, last_user = self._sent_at.get(name), view.last_user_sample_at
                latest = max(
                    -math.inf if sent is None else sent, -math.inf if last_user is None else last_user
                )
                until = min(until, latest + interval)
        return until

    def _watched_backends(self, policy: CompiledPolicy) -> frozenset[str]:
        """The candidates of routes with an SLO (asked every look: worked out once per policy)."""
        if self._watched is None or self._watched[0] is not policy:
            routes = policy.routes.values()
            watched = frozenset(name for route in routes if route.has_slo for name in route.backends)
            self._watched = (policy, watched)
        return self._watched[1]

    @staticmethod
    def bars(policy: CompiledPolicy, view_of: PlanViewOf) -> dict[str, RecoveryBar]:
        """Per backend, what answers must show now to end a slow spell (see recovery.py)."""
        routes = policy.routes.values()
        bars = {}
        for name in policy.backends:
            view = view_of(name)
            bars[name] = recovery_bar(name, routes, view.ttft_p95_s, view.decode_tokens_per_s)
        return bars

    def finished(self, name: str, recovering: bool) -> None:
        """A probe ended; one that began to show a recovery is confirmed at once, not an interval later."""
        self._settled.add(name)
        if recovering:
            self._pending.add(name)

    def paid(self, now: float, usd: float) -> None:
        self._paid.append((now, usd))

    def start_up_done(self, policy: CompiledPolicy, view_of: ViewOf, now: float) -> bool:
        """Whether every route with an SLO can be served sighted (``start_up_waiting_for`` is empty).
        True at once with start-up probes off, and ``tuning.probes.startup_timeout_s`` after the
        first look whatever they found."""
        settings = policy.tuning.probes
        if not settings.enabled or not settings.on_start:
            return True
        started = self.started_at
        if started is not None and now - started >= settings.startup_timeout_s:
            return True
        return not self.start_up_waiting_for(policy, view_of)

    def start_up_waiting_for(self, policy: CompiledPolicy, view_of: ViewOf) -> list[str]:
        """The routes with an SLO that have no candidate measured within it and one not yet probed."""
        waiting = []
        for route in policy.routes.values():
            if not route.has_slo:
                continue
            views = [view_of(name) for name in route.backends]
            if any(_within(view, route.slo.ttft_p95_ms) for view in views):
                continue
            if all(v.name in self._settled or v.samples or not v.healthy or v.booting for v in views):
                continue
            waiting.append(route.name)
        return waiting

    def _affordable(
        self, policy: CompiledPolicy, backend: CompiledBackend, view: PlanView, now: float, tokens: int
    ) -> bool:
        """A pool's probe costs nothing extra while it has headroom; a paid API's comes out of the
        policy's probe budget."""
        if backend.pool_price is not None:
            waiting = view.signals.waiting if view.signals is not None else None
            return view.inflight < backend.max_concurrency and not waiting
        while self._paid and self._paid[0][0] < now - SECONDS_PER_HOUR:
            self._paid.popleft()
        spent = sum(usd for _, usd in self._paid)
        prices = backend.token_prices
        estimate = 0.0 if prices is None else PROBE_PROMPT_TOKENS * prices.input + tokens * prices.output
        return spent + estimate <= policy.tuning.probes.paid_budget_usd_per_hour


def _within(view: BackendView, slo_ms: float | None) -> bool:
    """Measured, and within the route's TTFT SLO (a route asking only for speed: measured at all)."""
    if not view.samples:
        return False
    return slo_ms is None or (view.ttft_p95_s is not None and view.ttft_p95_s * 1000.0 <= slo_ms)
