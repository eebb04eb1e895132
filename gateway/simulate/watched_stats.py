"""``LiveStats`` that note which backends anything was fed about since the simulated prober last read
them, so that a tick with nothing new (and nothing due by time) reads nothing (``probing.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.measure.health import CircuitState
from gateway.measure.recovery import NOT_EXCLUDED, RecoveryBar
from gateway.measure.stats import AttemptTicket, LiveStats, ProbeView
from gateway.values.observation import Attempt


class WatchedStats(LiveStats):
    """Every feed that can change what the probe plan reads marks the backend ``touched``. Signals
    do not: the plan reads them only once a backend is due by time, when the prober looks anyway."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self.touched: set[str] = set()

    def attempt_started(self, backend: str, *, probe: bool = False) -> AttemptTicket:
        self.touched.add(backend)
        return super().attempt_started(backend, probe=probe)

    def attempt_finished(self, ticket: AttemptTicket, attempt: Attempt, route: str) -> None:
        self.touched.add(ticket.backend)
        super().attempt_finished(ticket, attempt, route)

    def merge_remote(self, attempt: Attempt, route: str, at: float) -> None:
        self.touched.add(attempt.backend)
        super().merge_remote(attempt, route, at)

    def set_remote_inflight(self, backend: str, inflight: int) -> None:
        self.touched.add(backend)
        super().set_remote_inflight(backend, inflight)

    def adopt_circuit(self, backend: str, state: CircuitState, cooldown_s: float, left_s: float) -> None:
        self.touched.add(backend)
        super().adopt_circuit(backend, state, cooldown_s, left_s)

    def set_health(self, backend: str, healthy: bool, booting: bool = False) -> None:
        self.touched.add(backend)
        super().set_health(backend, healthy, booting)

    def pause(self, backend: str, until: float) -> None:
        self.touched.add(backend)
        super().pause(backend, until)

    def probe_finished(
        self,
        ticket: AttemptTicket,
        attempt: Attempt,
        recovery_probes: int,
        ratio: float,
        bar: RecoveryBar = NOT_EXCLUDED,
    ) -> None:
        self.touched.add(ticket.backend)
        super().probe_finished(ticket, attempt, recovery_probes, ratio, bar)

    def read_touched(self, backend: str) -> ProbeView:
        """``probe_view``, after which the backend is untouched unless new samples still wait to be
        summarized (a summary is at most every ``refresh_s``: its p95 may change at a later read)."""
        view = self.probe_view(backend)
        if not self._stats(backend).samples_pending:
            self.touched.discard(backend)
        return view

    def wakes_at(self, backend: str) -> float:
        """The next moment what the plan reads changes with nothing fed: a circuit turns half-open,
        a pause ends (``math.inf`` when neither is ahead)."""
        return self._stats(backend).wakes_at(self.clock())
