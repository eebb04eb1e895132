"""The ledger's health as Prometheus sees it: is the database taking rows, how old is the backlog, how
many rows wait in the local spool and went through it, which kind of row a full bound dropped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.ledger.writer import Ledger


def ledger_health(ledger: Ledger, wall: float) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "gateway_ledger_up",
        "1 while the ledger database takes writes; 0 while it is away (rows wait in the spool or memory).",
        value=int(ledger.up),
    )
    oldest = ledger.oldest_pending_since
    waiting = ledger.pending or ledger.spooled
    yield GaugeMetricFamily(
        "gateway_ledger_oldest_pending_age_seconds",
        "How long the oldest unwritten ledger row (in memory or the spool) has waited (0 when none waits).",
        value=0.0 if oldest is None or not waiting else max(0.0, wall - oldest),
    )
    yield GaugeMetricFamily(
        "gateway_ledger_spool_rows",
        "Ledger rows in the local spool now, waiting for the database (the spool's depth).",
        value=ledger.spooled,
    )
    yield CounterMetricFamily(
        "gateway_ledger_rows_spooled",
        "Ledger rows moved to the local spool because the database was away (written from it later).",
        value=ledger.rows_spooled,
    )
    yield CounterMetricFamily(
        "gateway_ledger_spool_errors",
        "Failed reads or writes of the local spool (full disk, locked, read-only): rows stay in memory.",
        value=ledger.spool_errors,
    )
    dropped = CounterMetricFamily(
        "gateway_ledger_rows_dropped",
        "Ledger rows dropped, by kind: billable (neither database nor spool took them within the memory"
        " bound), refused (a refused request past the refusals' own bounds) or rejected (the database"
        " refused the row even scrubbed; the log holds it whole).",
        labels=["kind"],
    )
    dropped.add_metric(["billable"], ledger.rows_dropped_billable)
    dropped.add_metric(["refused"], ledger.refused.dropped)
    dropped.add_metric(["rejected"], ledger.rows_rejected)
    yield dropped
    yield CounterMetricFamily(
        "gateway_ledger_rows_scrubbed",
        "Ledger rows written with a value no column takes made safe: a NUL byte replaced, a count clamped"
        " to 2^31-1, a non-finite number cleared (an upstream that lied about usage, say).",
        value=ledger.rows_scrubbed,
    )
    yield CounterMetricFamily(
        "gateway_ledger_refusals_folded",
        "Refused requests counted in a per-minute row of their reason, key and route instead of a row"
        " of their own (past the refusals' per-minute bound).",
        value=ledger.refused.folded,
    )
