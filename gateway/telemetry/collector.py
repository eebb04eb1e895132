"""The exporter's counts as Prometheus metrics, read at scrape time (nothing per request)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.telemetry.exporter import SpanExporter


class TraceExportCollector:
    def __init__(self, exporter: SpanExporter[Any]) -> None:
        self._exporter = exporter

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        exporter = self._exporter
        exported = CounterMetricFamily("gateway_trace_spans_exported", "Spans the OTLP receiver accepted.")
        exported.add_metric([], exporter.exported_spans)
        yield exported
        dropped = CounterMetricFamily(
            "gateway_trace_spans_dropped",
            "Spans never exported: queue_full (the exporter fell behind: its receiver slow or down) or "
            "export_failed (the receiver refused, failed or timed out).",
            labels=["reason"],
        )
        for reason, count in sorted(exporter.dropped_spans.items()):
            dropped.add_metric([reason], count)
        yield dropped
        queued = GaugeMetricFamily("gateway_trace_queue", "Settled requests waiting for the exporter.")
        queued.add_metric([], exporter.queued)
        yield queued
