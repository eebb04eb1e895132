"""The live desired-replicas signal: arrivals per route over a recent window, forecast one boot time
ahead, sized by the capacity model, with hysteresis (up at once, down only after a sustained drop).

An autoscaler (KEDA's Prometheus scaler, an HPA on external metrics, a scale-to-zero platform) reads
``gateway_pool_desired_replicas{pool}`` and starts replicas before the traffic that needs them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gateway.measure.capacity import Demand, ReplicaShape, replicas_worth_running
from gateway.policy.compiled import CompiledBackend, CompiledPolicy
from gateway.policy.schema import Scaling

BUCKET_S = 1.0  # arrivals are counted per second of the clock
# Scaling down waits until even this much more traffic would not need the replicas: no flapping
# at the edge.
DOWN_MARGIN = 1.2
PRIOR_OUTPUT_TOKENS = 1000.0


class ArrivalWindow:
    """Arrivals of one route, counted per second, kept for the two windows the trend compares."""

    __slots__ = ("_buckets", "output_tokens")

    def __init__(self, prior_output_tokens: float) -> None:
        self._buckets: deque[list[float]] = deque()  # [second, count], oldest first
        self.output_tokens = prior_output_tokens  # a decayed mean of finished requests' output

    def arrived(self, now: float) -> None:
        second = math.floor(now / BUCKET_S) * BUCKET_S
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += 1
        else:
            self._buckets.append([second, 1.0])

    def rates(self, now: float, window_s: float) -> tuple[float, float]:
        """Arrivals per second in the last window and in the one before it."""
        while self._buckets and self._buckets[0][0] < now - 2 * window_s:
            self._buckets.popleft()
        recent = sum(c for at, c in self._buckets if at >= now - window_s)
        before = sum(c for at, c in self._buckets if at < now - window_s)
        return recent / window_s, before / window_s


@dataclass
class _Hold:
    desired: int = 0
    lower_since: float | None = None  # when the sized value first fell below ``desired``


class DemandSignal:
    """Per route arrivals and output lengths in; per pool desired replicas out."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._routes: dict[str, ArrivalWindow] = {}
        self._holds: dict[str, _Hold] = {}

    def arrived(self, route: str) -> None:
        self._window(route).arrived(self._clock())

    def finished(self, route: str, output_tokens: int) -> None:
        if output_tokens > 0:
            window = self._window(route)
            window.output_tokens += 0.1 * (output_tokens - window.output_tokens)

    def _window(self, route: str) -> ArrivalWindow:
        window = self._routes.get(route)
        if window is None:
            window = self._routes[route] = ArrivalWindow(PRIOR_OUTPUT_TOKENS)
        return window

    def desired_replicas(
        self, policy: CompiledPolicy, decode_speed: Callable[[str], float | None]
    ) -> dict[str, int]:
        """Each scaled pool's replicas to run one boot time from now; ``decode_speed`` is its live
        per-stream decode speed, when measured."""
        now = self._clock()
        out: dict[str, int] = {}
        for name, backend in policy.backends.items():
            scaling, pool = backend.scaling, backend.pool_price
            if scaling is None or pool is None:
                continue
            demand = self._demand(policy, name, scaling, now)
            shape = replica_shape(backend, scaling, decode_speed(name))
            api = spill_usd_per_token(policy, [r.name for r in policy.routes.values() if name in r.backends])
            up = replicas_worth_running(demand, shape, api)
            padded = Demand(demand.arrivals_per_s * DOWN_MARGIN, demand.output_tokens)
            out[name] = self._hysteresis(name, up, replicas_worth_running(padded, shape, api), scaling, now)
        return out

    def _demand(self, policy: CompiledPolicy, pool: str, scaling: Scaling, now: float) -> Demand:
        """The pool's routes' forecast arrivals one boot time ahead (the recent rate plus its trend,
        never below the recent rate: a falling trend is hysteresis's business) and their mean length."""
        rate = tokens = 0.0
        for route in policy.routes.values():
            window = self._routes.get(route.name)
            if pool not in route.backends or window is None:
                continue
            recent, before = window.rates(now, scaling.window_s)
            trend = (recent - before) / scaling.window_s
            forecast = recent + max(0.0, trend) * scaling.boot_s
            forecast = min(forecast, 2 * recent)  # a short burst does not extrapolate to the moon
            rate += forecast
            tokens += forecast * window.output_tokens
        return Demand(rate, tokens / rate if rate > 0 else PRIOR_OUTPUT_TOKENS)

    def _hysteresis(self, pool: str, up: int, down: int, scaling: Scaling, now: float) -> int:
        hold = self._holds.setdefault(pool, _Hold())
        if up >= hold.desired:
            hold.desired, hold.lower_since = up, None
        elif down >= hold.desired:
            hold.lower_since = None  # within the margin: keep what runs
        elif hold.lower_since is None:
            hold.lower_since = now
        elif now - hold.lower_since >= scaling.scale_down_after_s:
            hold.desired, hold.lower_since = down, None
        return hold.desired


def replica_shape(backend: CompiledBackend, scaling: Scaling, measured_speed: float | None) -> ReplicaShape:
    """One replica as the policy describes it, the measured per-stream speed filling what it leaves out."""
    assert backend.pool_price is not None
    speed = scaling.stream_tokens_per_s or measured_speed or backend.pool_price.assumed_tokens_per_s or 1.0
    return ReplicaShape(
        usd_per_hour=backend.pool_price.usd_per_hour,
        streams=scaling.streams_per_replica or backend.max_concurrency,
        stream_tokens_per_s=speed,
        max_replicas=scaling.max_replicas,
    )


def spill_usd_per_token(policy: CompiledPolicy, routes: Iterable[str]) -> float | None:
    """Where a pool's traffic spills: the cheapest per-token output price on ``routes``."""
    prices = [
        backend.token_prices.output
        for route in routes
        for name in policy.routes[route].backends
        if (backend := policy.backends[name]).token_prices is not None
    ]
    return min(prices, default=None)


def idle_usd_per_hour(backend: CompiledBackend, aggregate_tokens_per_s: float | None) -> float | None:
    """The part of a pool's hour nobody's tokens paid for, at its live throughput."""
    pool = backend.pool_price
    if pool is None:
        return None
    capacity = pool.assumed_tokens_per_s
    scaling = backend.scaling
    if scaling is not None and scaling.stream_tokens_per_s is not None:
        capacity = scaling.stream_tokens_per_s * (scaling.streams_per_replica or backend.max_concurrency)
    if not capacity:
        return None
    used = min(1.0, (aggregate_tokens_per_s or 0.0) / capacity)
    return pool.usd_per_hour * (1.0 - used)


def pools_of(policy: CompiledPolicy) -> Mapping[str, CompiledBackend]:
    return {name: b for name, b in policy.backends.items() if b.pool_price is not None}
