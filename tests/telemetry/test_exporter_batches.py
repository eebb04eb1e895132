"""Woken by a full batch, the exporter posts full batches only: what the request path queues while one
is being posted waits for the next full batch (or the flush interval, or the stop) rather than going out
in a small post of its own, each post costing the same HTTP exchange whatever it carries."""

from __future__ import annotations

import time

from gateway.telemetry.context import Sampler
from gateway.telemetry.exporter import SpanExporter
from gateway.telemetry.otlp import span_ids, span_times, text_field
from gateway.telemetry.settings import TelemetrySettings
from tests.telemetry.receiver import otlp_receiver, spans_of

BATCH = 4


def one_span(index: int) -> list[bytes]:
    ids = span_ids(bytes(15) + b"\x01", index.to_bytes(8, "big"), b"")
    return [ids + text_field(5, "queued") + b"\x30\x01" + span_times(index, index)]


def test_a_wake_up_posts_full_batches_and_the_rest_waits_for_the_stop() -> None:
    with otlp_receiver() as (receiver, server):
        settings = TelemetrySettings(
            endpoint=f"{server.url}/v1/traces",
            headers=(),
            sampler=Sampler(),
            service_name="test",
            content=False,
            max_queued_traces=100,
            batch_traces=BATCH,
            flush_interval_s=3600.0,  # never, here: only full batches and the stop send anything
            export_timeout_s=5.0,
        )
        exporter: SpanExporter[int] = SpanExporter(settings, {}, one_span, lambda _: 1)
        for index in range(1, 2 * BATCH + 3):  # two full batches and two more
            exporter.put(index)
        deadline = time.monotonic() + 20
        while exporter.exported_spans < 2 * BATCH:
            assert time.monotonic() < deadline, f"exported {exporter.exported_spans}"
            time.sleep(0.01)
        time.sleep(0.2)  # room for a wrong post of the last two
        assert exporter.exported_spans == 2 * BATCH and exporter.queued == 2
        assert [len(spans_of(body)) for body in receiver.bodies] == [BATCH, BATCH]
        exporter.close()
        assert [len(spans_of(body)) for body in receiver.bodies] == [BATCH, BATCH, 2]
        assert exporter.queued == 0 and exporter.exported_spans == 2 * BATCH + 2
