"""The ledger's health as Prometheus sees it: is the database taking rows, how old is the backlog,
how many rows a shutdown had to spill to a local file."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.ledger.writer import Ledger


def ledger_health(ledger: Ledger, wall: float) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "gateway_ledger_up",
        "1 while the ledger database takes writes; 0 while it is away (rows wait in memory).",
        value=int(ledger.up),
    )
    oldest = ledger.oldest_pending_since
    yield GaugeMetricFamily(
        "gateway_ledger_oldest_pending_age_seconds",
        "How long the oldest unwritten ledger row has waited (0 when none waits).",
        value=0.0 if oldest is None or not ledger.pending else max(0.0, wall - oldest),
    )
    yield CounterMetricFamily(
        "gateway_ledger_rows_spilled",
        "Ledger rows a shutdown wrote to the local spill file because the shared ledger was away.",
        value=ledger.rows_spilled,
    )
