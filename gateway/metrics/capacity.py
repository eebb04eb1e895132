"""Capacity gauges, read at each scrape: the replicas each scaled pool should run one boot time from
now (what an autoscaler acts on) and the part of each pool's hour that no request paid for."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.measure.demand import DemandSignal, idle_usd_per_hour, pools_of
from gateway.measure.stats import LiveStats
from gateway.policy.compiled import CompiledPolicy


class CapacityCollector:
    def __init__(self, demand: DemandSignal, policy: Callable[[], CompiledPolicy], stats: LiveStats) -> None:
        self._demand = demand
        self._policy = policy
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        policy = self._policy()
        desired = GaugeMetricFamily(
            "gateway_pool_desired_replicas",
            "Replicas each scaled GPU-hour pool should run one boot time from now: those whose share of "
            "the forecast traffic would cost more on the paid API than their hour (0: send it all there).",
            labels=["pool"],
        )
        views = self._stats.snapshot(tuple(pools_of(policy)))

        def speed(name: str) -> float | None:
            return views[name].decode_tokens_per_s if name in views else None

        for pool, replicas in sorted(self._demand.desired_replicas(policy, speed).items()):
            desired.add_metric([pool], replicas)
        idle = GaugeMetricFamily(
            "gateway_pool_idle_usd_per_hour",
            "USD per hour of each GPU-hour pool that no request uses, at its live throughput.",
            labels=["pool"],
        )
        for name, backend in pools_of(policy).items():
            usd = idle_usd_per_hour(backend, views[name].aggregate_tokens_per_s)
            if usd is not None:
                idle.add_metric([name], usd)
        yield desired
        yield idle
