"""The OTLP/HTTP exporter, on the event loop: a bounded queue of settled requests, emptied in batches by
one task at a time that writes their spans, encodes the batch (``otlp``) and posts it with the gateway's
own HTTP client (``backends.wire``). The request path only appends to the queue; a receiver that is
down, refuses or hangs costs the task its ``export_timeout_s`` and the queue its room, and what does not
fit is dropped and counted, never waited for.

Why not a thread of its own (as it was until 2026-12-05): the gateway's worker is one core, where a
second thread only takes turns with the event loop for the GIL, each turn a handover both ways. Without
it, a traced whole answer measured ~3% less CPU at saturation (docs/performance.md, "Tracing off and
on"), and the post is bounded by the same clocks as every upstream call."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from gateway.backends.wire import WireError, WirePool, split_url
from gateway.telemetry.otlp import envelope, export_body
from gateway.telemetry.settings import TelemetrySettings
from gateway.telemetry.spans import AttributeValue

log = logging.getLogger("gateway")
SCOPE = ("gateway.telemetry", "1")
WARN_EVERY_S = 60.0
CLOSE_WAIT_S = 2.5  # within the 3 s the runtime's stop gives the exporter: it ends on its own terms
WRITE_TURN = 32  # spans of this many traces written, then the loop's other work gets a turn
ANSWER_LIMIT = 1 << 20  # a receiver's answer to an export (OTLP's is a small message) is read, then dropped
# A post closes at ``batch_traces`` traces or at this many bytes of spans, whichever comes first: traces
# that carry prompts and answers (``telemetry.content``) can be tens of KB each, and receivers refuse
# large bodies (the OpenTelemetry Collector's OTLP/HTTP receiver at 20 MiB by default, gRPC-fronted
# stores at 4 MiB). A trace without content is ~2 KB, so a default batch (~2 MB) stays under it.
MAX_POST_BYTES = 4 << 20


# A settled request (or probe) whose spans are written only when its batch is posted.
Pending = TypeVar("Pending")


class SpanExporter(Generic[Pending]):
    """``write``: a pending item's OTLP ``Span`` messages (called as its batch is posted); ``count``:
    how many spans it stands for (called where one is dropped). ``put`` is called on the event loop."""

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
        self._origin, path = split_url(settings.endpoint)
        headers = {"content-type": "application/x-protobuf", **dict(settings.headers)}
        self._head = self._origin.head(path, headers)
        self._pool = WirePool()  # one connection, kept alive between posts
        self._task: asyncio.Task[None] | None = None  # the post under way: one at a time
        self._timer: asyncio.TimerHandle | None = None  # the flush interval, armed while any waits
        self._closing = False
        self._warned_at = -WARN_EVERY_S
        # Read at scrape time (the collector).
        self.exported_spans = 0
        self.dropped_spans: dict[str, int] = {"queue_full": 0, "export_failed": 0}

    def put(self, pending: Pending) -> None:
        """On the request path: one append, or a drop counted when the queue is full. A full batch
        starts a post unless one is under way; a lone trace waits at most the flush interval."""
        queue = self._queue
        if len(queue) >= self._max:
            self.dropped_spans["queue_full"] += self._count(pending)
            return
        queue.append(pending)
        if self._task is None and not self._closing:  # closing: ``close`` sends what is queued
            if len(queue) >= self._batch:
                self._start(self._batch)
            elif self._timer is None:
                self._arm_timer()

    async def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Export what is queued, waiting at most ``timeout_s`` (a hung receiver cannot hold a stop)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            async with asyncio.timeout(timeout_s):
                if self._task is not None:
                    await asyncio.shield(self._task)
                await self._export_queued(1)
        except TimeoutError:
            if self._task is not None:
                self._task.cancel()
            log.warning(
                "OTLP export: the stop's %gs ran out; %d traces not sent", timeout_s, len(self._queue)
            )
        finally:
            self._pool.close()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _start(self, at_least: int) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(at_least))

    def _arm_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._settings.flush_interval_s, self._flush_due)

    def _flush_due(self) -> None:
        self._timer = None
        if self._closing:
            return
        if self._task is None:
            if self._queue:
                self._start(1)
        else:  # a post is under way: what waits goes with the next one, or at the next interval
            self._arm_timer()

    async def _run(self, at_least: int) -> None:
        try:
            # Started by a full batch: full batches while they last. What is queued while one is
            # posted goes with the next full batch, or at the flush interval (``at_least`` 1: all of
            # it), rather than in a small post of its own: each post costs the same HTTP exchange
            # whatever it carries.
            await self._export_queued(at_least)
        except Exception:  # a bug here must not leave the exporter stuck with a task that ended
            log.exception("OTLP export failed")
        finally:
            self._task = None
            if self._queue and self._timer is None and not self._closing:
                self._arm_timer()

    async def _export_queued(self, at_least: int) -> None:
        queue = self._queue
        write = self._write
        while len(queue) >= at_least:
            spans: list[bytes] = []
            traces = size = 0
            while queue and traces < self._batch and size < MAX_POST_BYTES:
                pending = queue.popleft()
                traces += 1
                try:
                    written = write(pending)
                except Exception:  # a bug in writing one request's spans must not stop the exporter
                    log.exception("could not write a trace's spans")
                    self.dropped_spans["export_failed"] += self._count(pending)
                else:
                    spans += written
                    size += sum(map(len, written))
                if traces % WRITE_TURN == 0:
                    # A batch of traces that hold their prompts and answers (written as JSON) must not
                    # hold up the streams: the loop takes its turn every WRITE_TURN traces.
                    await asyncio.sleep(0)
            if spans:
                await self._post(export_body(self._envelope, spans), len(spans))

    async def _post(self, body: bytes, count: int) -> None:
        try:
            async with asyncio.timeout(self._settings.export_timeout_s):
                response = await self._pool.post(self._origin, self._head, body, None, 1)
                try:
                    await response.read(ANSWER_LIMIT)
                finally:
                    response.close()
        except TimeoutError:
            self._failed(count, f"no answer in {self._settings.export_timeout_s:g}s")
            return
        except (WireError, OSError) as exc:
            self._failed(count, str(exc))
            return
        if 200 <= response.status < 300:
            self.exported_spans += count
        else:
            self._failed(count, f"HTTP {response.status}")

    def _failed(self, count: int, why: str) -> None:
        self.dropped_spans["export_failed"] += count
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:  # one line a minute, however many batches fail
            self._warned_at = now
            log.warning(
                "OTLP export to %s failed (%s); %d spans dropped", self._settings.endpoint, why, count
            )
