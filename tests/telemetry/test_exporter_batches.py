"""A full batch starts a post, and the exporter posts full batches only: what the request path queues
while one is being posted waits for the next full batch (or the flush interval, or the stop) rather than
going out in a small post of its own, each post costing the same HTTP exchange whatever it carries."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway.telemetry import exporter as exporter_module
from gateway.telemetry.exporter import SpanExporter
from gateway.telemetry.otlp import span_ids, span_times, text_field
from tests.telemetry.receiver import exporter_settings, hanging_receiver, otlp_receiver, spans_of

BATCH = 4


def one_span(index: int) -> list[bytes]:
    ids = span_ids(bytes(15) + b"\x01", index.to_bytes(8, "big"), b"")
    return [ids + text_field(5, "queued") + b"\x30\x01" + span_times(index, index)]


async def exported(exporter: SpanExporter[int], count: int) -> None:
    deadline = time.monotonic() + 20
    while exporter.exported_spans < count:
        assert time.monotonic() < deadline, f"exported {exporter.exported_spans}"
        await asyncio.sleep(0.01)


async def test_full_batches_go_at_once_and_the_rest_waits_for_the_stop() -> None:
    with otlp_receiver() as (receiver, server):
        # The flush interval never comes, here: only full batches and the stop send anything.
        exporter: SpanExporter[int] = SpanExporter(
            exporter_settings(server.url, BATCH, 3600.0), {}, one_span, lambda _: 1
        )
        for index in range(1, 2 * BATCH + 3):  # two full batches and two more
            exporter.put(index)
        await exported(exporter, 2 * BATCH)
        await asyncio.sleep(0.2)  # room for a wrong post of the last two
        assert exporter.exported_spans == 2 * BATCH and exporter.queued == 2
        assert [len(spans_of(body)) for body in receiver.bodies] == [BATCH, BATCH]
        await exporter.close()
        assert [len(spans_of(body)) for body in receiver.bodies] == [BATCH, BATCH, 2]
        assert exporter.queued == 0 and exporter.exported_spans == 2 * BATCH + 2


async def test_a_post_closes_at_its_byte_cap_before_its_trace_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces that carry prompts and answers are large: a post stops taking traces once its spans pass
    ``MAX_POST_BYTES`` (here 1,000 bytes, traces of ~400), and the rest go in the next."""
    monkeypatch.setattr(exporter_module, "MAX_POST_BYTES", 1000)

    def large_span(index: int) -> list[bytes]:
        ids = span_ids(bytes(15) + b"\x01", index.to_bytes(8, "big"), b"")
        return [ids + text_field(5, "x" * 380) + b"\x30\x01" + span_times(index, index)]

    with otlp_receiver() as (receiver, server):
        exporter: SpanExporter[int] = SpanExporter(
            exporter_settings(server.url, BATCH, 3600.0), {}, large_span, lambda _: 1
        )
        for index in range(1, BATCH + 1):  # a full batch by count: 4 traces, ~1,600 bytes
            exporter.put(index)
        await exported(exporter, 3)
        assert [len(spans_of(body)) for body in receiver.bodies] == [3]
        await asyncio.sleep(0.2)  # room for a wrong post of the fourth
        assert len(receiver.bodies) == 1 and exporter.queued == 1  # it waits for the next post
        await exporter.close()
        assert [len(spans_of(body)) for body in receiver.bodies] == [3, 1]
        assert exporter.exported_spans == BATCH


async def test_a_lone_trace_goes_at_the_flush_interval() -> None:
    with otlp_receiver() as (receiver, server):
        exporter: SpanExporter[int] = SpanExporter(
            exporter_settings(server.url, BATCH, 0.1), {}, one_span, lambda _: 1
        )
        exporter.put(1)
        assert exporter.queued == 1
        await exported(exporter, 1)
        exporter.put(2)  # the interval is armed again by the next one that waits
        await exported(exporter, 2)
        assert [len(spans_of(body)) for body in receiver.bodies] == [1, 1]
        await exporter.close()


async def test_a_stop_with_a_hung_receiver_ends_within_its_bound_and_says_what_was_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with hanging_receiver() as url:
        exporter: SpanExporter[int] = SpanExporter(
            exporter_settings(url, BATCH, 3600.0), {}, one_span, lambda _: 1
        )
        for index in range(1, BATCH + 3):  # a full batch, posted at once and stuck, and two waiting
            exporter.put(index)
        await asyncio.sleep(0.2)
        with caplog.at_level(logging.WARNING, logger="gateway"):
            async with asyncio.timeout(30):  # a bound far past the stop's: it must end by itself
                await exporter.close(timeout_s=0.5)
        assert exporter.exported_spans == 0
        assert "the stop's 0.5s ran out; 2 traces not sent" in caplog.text


async def test_a_trace_whose_spans_cannot_be_written_is_counted_and_its_batch_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every request's spans are written by the exporter as it posts their batch: a bug in writing one
    (here: trace 3) drops that trace, counted as export_failed, and never the batch or the exporter."""

    def write(index: int) -> list[bytes]:
        if index == 3:
            raise ValueError("a bug in the span writer")
        return one_span(index)

    with otlp_receiver() as (receiver, server), caplog.at_level(logging.ERROR, logger="gateway"):
        exporter: SpanExporter[int] = SpanExporter(
            exporter_settings(server.url, BATCH, 3600.0), {}, write, lambda _: 2
        )
        for index in range(1, 2 * BATCH + 1):
            exporter.put(index)
        await exported(exporter, 2 * BATCH - 1)
        await exporter.close()
        assert exporter.dropped_spans["export_failed"] == 2  # the count says how many spans it stood for
        assert [len(spans_of(body)) for body in receiver.bodies] == [BATCH - 1, BATCH]
    assert "could not write a trace's spans" in caplog.text
