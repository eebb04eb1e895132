"""Metrics of what routing does besides answering requests: probes sent, requests waiting for a
candidate and the time they waited, backends paused by an upstream rate limit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from gateway.runtime import Runtime


class RoutingCollector:
    """Read at each scrape from the runtime's prober, waiting room and live stats."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime
        probes = CounterMetricFamily(
            "gateway_probes",
            "Synthetic probes sent to keep a backend measured, by backend and outcome (ok, failed); "
            "billed to no route or key.",
            labels=["backend", "outcome"],
        )
        for (backend, outcome), count in sorted(runtime.probes.sent.items()):
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
        now = runtime.clock()
        for name, view in runtime.stats.snapshot(runtime.policy.backends).items():
            if view.last_probe_at is not None:
                last_probe.add_metric([name], now - view.last_probe_at)
            paused.add_metric([name], runtime.stats.paused_for(name))
        waiting = GaugeMetricFamily(
            "gateway_waiting_requests",
            "Requests waiting for a free or unpaused candidate, by route.",
            labels=["route"],
        )
        for route, count in sorted(runtime.waiting.waiting().items()):
            waiting.add_metric([route], count)
        waited = CounterMetricFamily(
            "gateway_queue_wait_seconds",
            "Seconds requests spent waiting for a candidate, by route.",
            labels=["route"],
        )
        for route, seconds in sorted(runtime.waiting.waited_s.items()):
            waited.add_metric([route], seconds)
        outcomes = CounterMetricFamily(
            "gateway_queued_requests",
            "Requests that waited for a candidate, by route and outcome (served, refused with 429).",
            labels=["route", "outcome"],
        )
        for (route, outcome), count in sorted(runtime.waiting.outcomes.items()):
            outcomes.add_metric([route, outcome], count)
        yield from (probes, last_probe, paused, waiting, waited, outcomes)
