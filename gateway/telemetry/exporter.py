"""The OTLP/HTTP exporter: a bounded queue of settled requests, emptied in batches by a thread of its own
that builds their spans, encodes them (``otlp``) and posts them. The request path only appends to the
queue; a receiver that is down, refuses or hangs costs the thread its ``export_timeout_s`` and the queue
its room, and what does not fit is dropped and counted, never waited for."""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from gateway.telemetry.otlp import envelope, export_body
from gateway.telemetry.settings import TelemetrySettings
from gateway.telemetry.spans import AttributeValue

log = logging.getLogger("gateway")
SCOPE = ("gateway.telemetry", "1")
WARN_EVERY_S = 60.0
CLOSE_WAIT_S = 5.0


# A settled request (or probe) whose spans are written only in the exporter's thread.
Pending = TypeVar("Pending")


class SpanExporter(Generic[Pending]):
    """``write``: a pending item's OTLP ``Span`` messages (called in the exporter's thread);
    ``count``: how many spans it stands for (called where one is dropped)."""

    def __init__(
        self,
        settings: TelemetrySettings,
        resource: Mapping[str, AttributeValue],
        write: Callable[[Pending], list[bytes]],
        count: Callable[[Pending], int],
    ) -> None:
        self._settings = settings
        self._envelope = envelope(resource, SCOPE)
        self._write, self._count = write, count
        self._queue: deque[Pending] = deque()
        self._max, self._batch = settings.max_queued_traces, settings.batch_traces
        self._wake, self._stopping = threading.Event(), threading.Event()
        url = urlsplit(settings.endpoint)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "localhost", url.port
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._connection: http.client.HTTPConnection | None = None
        self._headers = {"content-type": "application/x-protobuf", **dict(settings.headers)}
        self._warned_at = -WARN_EVERY_S
        # Counted in the exporter's thread or under the GIL by the request path: read at scrape time.
        self.exported_spans = 0
        self.dropped_spans: dict[str, int] = {"queue_full": 0, "export_failed": 0}
        self._thread = threading.Thread(target=self._run, name="otlp-exporter", daemon=True)
        self._thread.start()

    def put(self, pending: Pending) -> None:
        """On the request path: one append, or a drop counted when the queue is full."""
        queue = self._queue
        if len(queue) >= self._max:
            self.dropped_spans["queue_full"] += self._count(pending)
            return
        queue.append(pending)
        if len(queue) == self._batch:
            self._wake.set()

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Export what is queued, waiting at most ``timeout_s`` (a hung receiver cannot hold a stop)."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout_s)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def full(self) -> bool:
        """Whatever is put now is dropped (and counted)."""
        return len(self._queue) >= self._max

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self._settings.flush_interval_s)
            self._wake.clear()
            stopping = self._stopping.is_set()
            # Woken by a full batch: only full batches go. What the request path queues while one is
            # posted waits for the next (its own wake-up, or the flush interval), rather than leaving
            # in a small post of its own: under load that made three posts per wake-up (~85 requests
            # each), and each post costs the same HTTP exchange whatever it carries.
            self._export_queued(self._batch if woken and not stopping else 1)
            if stopping:
                if self._connection is not None:
                    self._connection.close()
                return

    def _export_queued(self, at_least: int = 1) -> None:
        queue = self._queue
        while len(queue) >= at_least:
            batch: list[Pending] = []
            while queue and len(batch) < self._batch:
                batch.append(queue.popleft())
            spans: list[bytes] = []
            write = self._write
            for pending in batch:
                try:
                    spans += write(pending)
                except Exception:  # a bug in writing one request's spans must not stop the exporter
                    log.exception("could not write a trace's spans")
                    self.dropped_spans["export_failed"] += self._count(pending)
            if spans:
                self._post(export_body(self._envelope, spans), len(spans))

    def _post(self, body: bytes, count: int) -> None:
        try:
            status = self._send(body)
        except (OSError, http.client.HTTPException) as exc:
            self._close_connection()
            self._failed(count, f"{type(exc).__name__}: {exc}")
            return
        if 200 <= status < 300:
            self.exported_spans += count
        else:
            self._failed(count, f"HTTP {status}")

    def _send(self, body: bytes) -> int:
        connection = self._connection
        if connection is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            connection = self._connection = kind(
                self._host, self._port, timeout=self._settings.export_timeout_s
            )
        connection.request("POST", self._path, body, self._headers)
        response = connection.getresponse()
        response.read()
        if response.will_close:
            self._close_connection()
        return response.status

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _failed(self, count: int, why: str) -> None:
        self.dropped_spans["export_failed"] += count
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:  # one line a minute, however many batches fail
            self._warned_at = now
            log.warning(
                "OTLP export to %s failed (%s); %d spans dropped", self._settings.endpoint, why, count
            )
