"""Circuit breaking per backend: stop sending to a backend that keeps failing, probe it, let it back.

Covers single-backend routes too: an open circuit fails fast instead of queueing doomed requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from gateway.values.observation import Attempt

CircuitState = Literal["closed", "open", "half_open"]
CIRCUIT_STATE_CODES: Mapping[CircuitState, int] = MappingProxyType({"closed": 0, "open": 1, "half_open": 2})


def is_backend_failure(attempt: Attempt) -> bool | None:
    """True when the backend failed, False when it answered, None when the attempt says nothing of it.

    A 4xx is the client's fault (bad request, context too long): the backend is alive. A 429 says
    nothing of its health either: it is backpressure (``LiveStats.pause``).
    A client that hangs up tells us nothing about the backend.
    """
    status = attempt.status
    if status == "ok":
        return False
    if status == "cancelled":
        return None
    if status == "upstream_error" and attempt.http_status == 429:
        return None  # a rate limit is backpressure: the backend pauses until Retry-After instead
    if status == "upstream_error" and attempt.http_status is not None:
        return attempt.http_status >= 500
    return True


class CircuitBreaker:
    """closed -> open after ``failure_threshold`` consecutive failures or a high decayed failure rate;
    open -> half_open after a cooldown (doubling from ``base_cooldown_s`` up to ``max_cooldown_s``);
    half_open lets one probe through: its success closes the circuit, its failure re-opens it."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        failure_threshold: int = 5,
        failure_rate: float = 0.5,
        min_volume: float = 10.0,
        half_life_s: float = 30.0,
        base_cooldown_s: float = 1.0,
        max_cooldown_s: float = 30.0,
    ) -> None:
        self._clock = clock
        self._failure_threshold = failure_threshold
        self._failure_rate = failure_rate
        self._min_volume = min_volume
        self._half_life_s = half_life_s
        self._base_cooldown_s = base_cooldown_s
        self._max_cooldown_s = max_cooldown_s
        self._consecutive_failures = 0
        # Decayed counts of outcomes, so a burst long ago does not trip the rate rule today.
        self._decayed_total = 0.0
        self._decayed_failures = 0.0
        self._decayed_at = 0.0
        self._opened_at: float | None = None
        self._cooldown_s = base_cooldown_s
        self._probe_in_flight = False
        self.opened_count = 0  # for metrics: how often this circuit has opened
        self.closed_count = 0  # how often this breaker itself closed it (replicas share both events)

    @property
    def state(self) -> CircuitState:
        if self._opened_at is None:
            return "closed"
        return "half_open" if self._clock() >= self._opened_at + self._cooldown_s else "open"

    @property
    def state_code(self) -> int:
        return CIRCUIT_STATE_CODES[self.state]

    @property
    def half_open_at(self) -> float | None:
        """When an open circuit will let a probe through; None unless open."""
        return None if self._opened_at is None else self._opened_at + self._cooldown_s

    def allows_request(self) -> bool:
        """Whether a new attempt may be sent now; half-open allows one probe at a time."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._probe_in_flight)

    def attempt_started(self) -> bool:
        """Note an attempt going out; returns True when it is the half-open probe."""
        if self.state == "half_open" and not self._probe_in_flight:
            self._probe_in_flight = True
            return True
        return False

    def record(self, attempt: Attempt, *, probe: bool) -> None:
        """Feed one finished attempt; ``probe`` is what ``attempt_started`` returned for it."""
        failed = is_backend_failure(attempt)
        if probe:
            self._probe_in_flight = False
        if failed is None:
            return
        self._count(failed)
        if self._opened_at is None:
            if failed and self._should_open():
                self._open(self._base_cooldown_s)
            return
        # While open or half-open only the probe decides: attempts sent before the circuit opened
        # finish late and say little about the backend now.
        if probe:
            if failed:
                self._open(min(self._cooldown_s * 2, self._max_cooldown_s))
            else:
                self._close()

    def health_reported(self, healthy: bool, *, recovered: bool) -> None:
        """A health check says the backend is up again after being down: trust it and close.

        A steady "healthy" while requests fail (overload, timeouts) does not close the circuit:
        the health endpoint cannot see what requests see.
        """
        if healthy and recovered and self._opened_at is not None:
            self._close()

    @property
    def cooldown_s(self) -> float:
        return self._cooldown_s

    def adopt(self, state: CircuitState, cooldown_s: float, cooldown_left_s: float) -> None:
        """Follow another replica's breaker: it opened (a ``cooldown_s`` cooldown with
        ``cooldown_left_s`` to go) or closed. Not counted as this breaker's own opening, so the
        fleet's metrics count each opening once."""
        if state == "open" and cooldown_left_s > 0:
            self._opened_at = self._clock() - max(0.0, cooldown_s - cooldown_left_s)
            self._cooldown_s = cooldown_s
            self._probe_in_flight = False
        elif state == "closed" and self._opened_at is not None:
            self._reset()

    def _count(self, failed: bool) -> None:
        now = self._clock()
        decay = 0.5 ** (max(0.0, now - self._decayed_at) / self._half_life_s)
        self._decayed_at = now
        self._decayed_total = self._decayed_total * decay + 1.0
        self._decayed_failures = self._decayed_failures * decay + (1.0 if failed else 0.0)
        self._consecutive_failures = self._consecutive_failures + 1 if failed else 0

    def _should_open(self) -> bool:
        if self._consecutive_failures >= self._failure_threshold:
            return True
        return (
            self._decayed_total >= self._min_volume
            and self._decayed_failures / self._decayed_total > self._failure_rate
        )

    def _open(self, cooldown_s: float) -> None:
        self._opened_at = self._clock()
        self._cooldown_s = cooldown_s
        self._probe_in_flight = False
        self.opened_count += 1

    def _close(self) -> None:
        self.closed_count += 1
        self._reset()

    def _reset(self) -> None:
        self._opened_at = None
        self._cooldown_s = self._base_cooldown_s
        self._consecutive_failures = 0
        self._probe_in_flight = False
        # Start the rate rule afresh: the failures that opened the circuit are history now.
        self._decayed_total = 0.0
        self._decayed_failures = 0.0
