"""Metrics of what routing does besides answering requests: probes sent, requests waiting for a
candidate and the time they waited, backends paused by an upstream rate limit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from gateway.measure.stats import LiveStats
    from gateway.policy.compiled import CompiledPolicy


class WaitingCounts(Protocol):
    """What the metrics read of the request path's waiting room (``runtime/waiting.py``'s
    ``WaitingRoom``), named here so metrics/ needs nothing from the request path above it."""

    waited_s: dict[str, float]
    outcomes: Counter[tuple[str, str]]

    def waiting(self) -> dict[str, int]: ...


class RoutingCollector:
    """Read at each scrape from the prober's counts, the waiting room and the live stats."""

    def __init__(
        self,
        probes_sent: Counter[tuple[str, str]],
        policy: Callable[[], CompiledPolicy],
        stats: LiveStats,
        waiting: WaitingCounts,
        clock: Callable[[], float],
    ) -> None:
        self._probes_sent, self._policy, self._stats = probes_sent, policy, stats
        self._waiting, self._clock = waiting, clock

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stats, room = self._stats, self._waiting
        probes = CounterMetricFamily(
            "gateway_probes",
            "Synthetic probes sent to keep a backend measured, by backend and outcome (ok, failed); "
            "billed to no route or key.",
            labels=["backend", "outcome"],
        )
        for (backend, outcome), count in sorted(self._probes_sent.items()):
            probes.add_metric([backend, outcome], count)
        last_probe = GaugeMetricFamily(
            "gateway_backend_last_probe_age_seconds",
            "Seconds since each backend last answered a probe.",
            labels=["backend"],
        )
        paused = GaugeMetricFamily(
            "gateway_backend_paused_seconds",
            "Seconds left of a backend's pause after an upstream 429 (its Retry-After); 0 when not paused.",
            labels=["backend"],
        )
        now = self._clock()
        for name, view in stats.snapshot(self._policy().backends).items():
            if view.last_probe_at is not None:
                last_probe.add_metric([name], now - view.last_probe_at)
            paused.add_metric([name], stats.paused_for(name))
        waiting = GaugeMetricFamily(
            "gateway_waiting_requests",
            "Requests waiting for a free or unpaused candidate, by route.",
            labels=["route"],
        )
        for route, count in sorted(room.waiting().items()):
            waiting.add_metric([route], count)
        waited = CounterMetricFamily(
            "gateway_queue_wait_seconds",
            "Seconds requests spent waiting for a candidate, by route.",
            labels=["route"],
        )
        for route, seconds in sorted(room.waited_s.items()):
            waited.add_metric([route], seconds)
        outcomes = CounterMetricFamily(
            "gateway_queued_requests",
            "Requests that waited for a candidate, by route and outcome (served, refused with 429).",
            labels=["route", "outcome"],
        )
        for (route, outcome), count in sorted(room.outcomes.items()):
            outcomes.add_metric([route, outcome], count)
        yield from (probes, last_probe, paused, waiting, waited, outcomes)
