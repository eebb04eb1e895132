"""Scrape-time metrics: gauges and counters read from the gateway's state when Prometheus asks
(``LiveCollector``), and their copy into the per-process files when several workers serve
(``Mirror``). Their sources are handed in (``MetricSources``), not the whole runtime."""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.ledger.health import ledger_health
from gateway.measure.health import CIRCUIT_STATE_CODES
from gateway.money.costs import effective_usd_per_mtok

if TYPE_CHECKING:
    from gateway.ledger import Ledger
    from gateway.measure.stats import LiveStats
    from gateway.money.budgets import Budgets
    from gateway.policy.compiled import CompiledPolicy
    from gateway.store import StoreHealth

# How the workers' values of a scrape-time gauge combine; any other gauge shows the latest one set.
GAUGE_MODES: Mapping[str, Any] = MappingProxyType(
    {
        "gateway_backend_inflight_requests": "livesum",
        "gateway_ledger_pending_rows": "livesum",
        "gateway_ledger_up": "livemin",
        "gateway_ledger_oldest_pending_age_seconds": "livemax",
        "gateway_backend_circuit_state": "livemax",
        "gateway_store_up": "livemin",
        "gateway_policy_last_reload_ok": "livemin",
        "gateway_policy_last_reload_success_timestamp_seconds": "livemax",
    }
)
MIRROR_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class MetricSources:
    """Everything the scrape-time metrics read, each from its owner."""

    policy: Callable[[], CompiledPolicy]  # the running policy
    policy_source: object  # the policy holder: reloads, failures, last error (when it keeps them)
    stats: LiveStats
    budgets: Budgets
    ledger: Ledger
    store_health: StoreHealth
    errors_returned: Tally[tuple[str, str]]  # error responses by (origin, code)
    wall_clock: Callable[[], float]


class Mirror:
    """With several worker processes (PROMETHEUS_MULTIPROC_DIR set) counters and histograms live in
    prometheus_client's per-process files; this copies LiveCollector's families into them too: gauges
    by their ``GAUGE_MODES``, counters by the increase since the last copy (so workers' counts add up)."""

    def __init__(self, live: LiveCollector) -> None:
        self._live = live
        self._metrics: dict[str, Any] = {}
        self._copied: dict[tuple[str, tuple[str, ...]], float] = {}

    async def run(self) -> None:
        while True:
            self.update()
            await asyncio.sleep(MIRROR_INTERVAL_S)

    def update(self) -> None:
        for family in self._live.collect():
            counter = family.type == "counter"
            for sample in family.samples:
                if counter and not sample.name.endswith("_total"):
                    continue
                values = tuple(sample.labels.values())
                metric = self._metric(family, tuple(sample.labels))
                child = metric.labels(*values) if values else metric
                if not counter:
                    child.set(sample.value)
                    continue
                key = (family.name, values)
                increase = sample.value - self._copied.get(key, 0.0)
                if increase > 0:
                    child.inc(increase)
                self._copied[key] = sample.value

    def _metric(self, family: Metric, labels: tuple[str, ...]) -> Any:
        metric = self._metrics.get(family.name)
        if metric is None:
            if family.type == "counter":
                metric = Counter(family.name, family.documentation, labels, registry=None)
            else:
                mode = GAUGE_MODES.get(family.name, "livemostrecent")
                metric = Gauge(
                    family.name, family.documentation, labels, registry=None, multiprocess_mode=mode
                )
            self._metrics[family.name] = metric
        return metric


class LiveCollector:
    """Gauges that are read, not counted: computed from their sources at each scrape."""

    def __init__(self, sources: MetricSources, policy_loaded_at: Callable[[], float]) -> None:
        self._sources = sources
        self._policy_loaded_at = policy_loaded_at

    def describe(self) -> list[Metric]:
        return []  # families are built at scrape time; nothing to check for clashes up front

    def collect(self) -> Iterator[Metric]:
        yield from self._backends()
        yield self._errors()
        yield from self._budgets()
        yield from self._policy()
        yield from self._ledger()
        yield from self._store()

    def _backends(self) -> Iterator[Metric]:
        sources = self._sources
        policy = sources.policy()
        inflight = GaugeMetricFamily(
            "gateway_backend_inflight_requests",
            "Attempts this process has in flight to each backend.",
            labels=["backend"],
        )
        circuit = GaugeMetricFamily(
            "gateway_backend_circuit_state",
            "Circuit state: 0 closed, 1 open, 2 half-open.",
            labels=["backend"],
        )
        opened = CounterMetricFamily(
            "gateway_backend_circuit_opened", "Times each backend's circuit opened.", labels=["backend"]
        )
        price = GaugeMetricFamily(
            "gateway_backend_usd_per_million_output_tokens",
            "Effective USD per 1M output tokens: the list price, or a pool's hourly price over its live "
            "aggregate throughput.",
            labels=["backend"],
        )
        decode = GaugeMetricFamily(
            "gateway_backend_decode_tokens_per_second",
            "Live per-stream decode speed (time-decayed mean).",
            labels=["backend"],
        )
        for name, view in sources.stats.snapshot(policy.backends).items():
            inflight.add_metric([name], sources.stats.local_inflight(name))
            circuit.add_metric([name], CIRCUIT_STATE_CODES[view.circuit])
            opened.add_metric([name], sources.stats.circuit(name).opened_count)
            usd = effective_usd_per_mtok(policy.backends[name], view.aggregate_tokens_per_s)
            if usd is not None:
                price.add_metric([name], usd)
            if view.decode_tokens_per_s is not None:
                decode.add_metric([name], view.decode_tokens_per_s)
        yield from (inflight, circuit, opened, price, decode)

    def _errors(self) -> Metric:
        errors = CounterMetricFamily(
            "gateway_errors",
            "Error responses by origin and code: origin 'gateway' for its own refusals (bad request, auth, "
            "budget, no backend), 'upstream' for upstream faults passed on to the client.",
            labels=["origin", "code"],
        )
        for (origin, code), count in self._sources.errors_returned.items():
            errors.add_metric([origin, code], count)
        return errors

    def _budgets(self) -> Iterator[Metric]:
        sources = self._sources
        labels = ["scope", "name", "period"]
        families = {
            field: GaugeMetricFamily(f"gateway_budget_{field}_usd", help_text, labels=labels)
            for field, help_text in (
                ("limit", "Budget cap for the current UTC day or month."),
                ("spent", "USD spent against the budget this period."),
                ("reserved", "USD reserved by admitted requests still in flight."),
                ("remaining", "Cap minus spent minus reserved; negative when overspent."),
            )
        }
        for use in sources.budgets.usage(sources.policy(), sources.wall_clock()):
            key = [use.scope, use.name, use.period]
            families["limit"].add_metric(key, use.limit_usd)
            families["spent"].add_metric(key, use.spent_usd)
            families["reserved"].add_metric(key, use.reserved_usd)
            families["remaining"].add_metric(key, use.remaining_usd)
        yield from families.values()

    def _policy(self) -> Iterator[Metric]:
        source = self._sources.policy_source
        yield CounterMetricFamily(
            "gateway_policy_reloads", "Policy edits installed.", value=getattr(source, "reloads", 0)
        )
        yield CounterMetricFamily(
            "gateway_policy_reload_failures",
            "Policy edits rejected (the last good policy kept serving).",
            value=getattr(source, "reload_failures", 0),
        )
        ok = getattr(source, "last_error", None) is None
        yield GaugeMetricFamily(
            "gateway_policy_last_reload_ok", "1 if the policy file on disk is the one serving.", value=int(ok)
        )
        yield GaugeMetricFamily(
            "gateway_policy_last_reload_success_timestamp_seconds",
            "When the serving policy was installed (Unix time).",
            value=self._policy_loaded_at(),
        )

    def _ledger(self) -> Iterator[Metric]:
        ledger = self._sources.ledger
        yield CounterMetricFamily(
            "gateway_ledger_rows_written", "Ledger rows written to disk.", value=ledger.rows_written
        )
        yield CounterMetricFamily(
            "gateway_ledger_write_errors",
            "Failed ledger batch writes (kept and retried).",
            value=ledger.write_errors,
        )
        yield GaugeMetricFamily(
            "gateway_ledger_pending_rows",
            "Ledger rows waiting in memory to be written.",
            value=ledger.pending,
        )
        yield from ledger_health(ledger, self._sources.wall_clock())

    def _store(self) -> Iterator[Metric]:
        health = self._sources.store_health
        yield GaugeMetricFamily(
            "gateway_store_up",
            "1 while the state store (Redis, or memory) answers; 0 while it is unreachable.",
            value=int(health.up),
        )
        yield CounterMetricFamily(
            "gateway_store_faults",
            "Failed state store operations (timeouts, lost connections).",
            value=health.faults,
        )
