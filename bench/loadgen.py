"""An async HTTP/1.1 load generator on raw asyncio + httptools: closed-loop concurrency and open-loop rate.

It records per request the latency, and for streams the time to the first SSE event and the gaps
between events, with far less CPU per request than an HTTP client library would spend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httptools
import orjson

WindowHook = Callable[[str], None]  # called with "start" and "end" of the measured window


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    model: str
    stream: bool
    path: str = "/v1/chat/completions"
    min_events: int = 64  # a stream with fewer SSE events is counted as an error
    api_key: str = "sk-bench"

    def request_bytes(self) -> bytes:
        payload: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say hello in a few words."}],
            "max_tokens": 64,
        }
        if self.stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        body = orjson.dumps(payload)
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: application/json\r\nauthorization: Bearer {self.api_key}\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


@dataclass(slots=True)
class Sample:
    started: float
    done: float = 0.0
    status: int = 0
    events: int = 0
    first_event: float | None = None
    gaps: list[float] | None = None

    @property
    def latency(self) -> float:
        return self.done - self.started

    @property
    def ttft(self) -> float | None:
        return None if self.first_event is None else self.first_event - self.started


@dataclass(slots=True)
class Result:
    window_s: float
    ok: int = 0
    errors: int = 0
    events: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)  # "http 503", "short stream", "connection"

    @property
    def rps(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    def count_error(self, kind: str, n: int = 1) -> None:
        self.errors += n
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + n

    def add(self, sample: Sample, stream: bool, min_events: int) -> None:
        if sample.status != 200 or (stream and sample.events < min_events):
            self.count_error(f"http {sample.status}" if sample.status != 200 else "short stream")
            return
        self.ok += 1
        self.events += sample.events
        self.latencies.append(sample.latency)
        ttft = sample.ttft
        if ttft is not None:
            self.ttfts.append(ttft)
        if sample.gaps:
            self.gaps.extend(sample.gaps)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class ConnectionLost(Exception):
    pass


class Client(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, record_gaps: bool) -> None:
        self.record_gaps = record_gaps
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sample: Sample | None = None
        self.waiter: asyncio.Future[Sample] | None = None
        self.last_event = 0.0
        self.tail = b""
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionLost())

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_headers_complete(self) -> None:
        if self.sample is not None:
            self.sample.status = self.parser.get_status_code()
            self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        sample = self.sample
        if sample is None:
            return
        # Count SSE events by their "data:" field; keep a few bytes in case one is split.
        scan = self.tail + body
        found = scan.count(b"data:")
        self.tail = scan[-4:]
        if not found:
            return
        now = time.perf_counter()
        if sample.first_event is None:
            sample.first_event = now
        elif self.record_gaps and sample.gaps is not None:
            sample.gaps.append(now - self.last_event)
        self.last_event = now
        sample.events += found

    def on_message_complete(self) -> None:
        sample, waiter = self.sample, self.waiter
        if sample is None or waiter is None:
            return
        sample.done = time.perf_counter()
        self.sample = self.waiter = None
        if not waiter.done():
            waiter.set_result(sample)
        if not self.keep_alive:
            self.close()

    async def request(self, raw: bytes, started: float) -> Sample:
        if self.transport is None:
            raise ConnectionLost()
        self.sample = Sample(started=started, gaps=[] if self.record_gaps else None)
        self.tail = b""
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    @property
    def usable(self) -> bool:
        return self.transport is not None and self.keep_alive


async def connect(target: Target, record_gaps: bool) -> Client:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: Client(record_gaps), target.host, target.port)
    return client


async def closed_loop(
    target: Target,
    concurrency: int,
    duration_s: float,
    *,
    warmup_s: float = 0.0,
    total: int | None = None,
    record_gaps: bool = False,
    on_window: WindowHook | None = None,
    grace_s: float = 10.0,
    stagger_s: float = 0.0,
) -> Result:
    """``concurrency`` connections each send the next request when the last one ends.

    Only requests that end inside the window (after ``warmup_s``, before the duration ends) count.
    With ``total``, the run stops early once that many requests were sent. ``stagger_s`` spreads the
    connections' first requests over that time, so paced streams do not all tick at the same instant.
    """
    raw = target.request_bytes()
    start = time.perf_counter()
    window_start, deadline = start + warmup_s, start + warmup_s + duration_s
    samples: list[Sample] = []
    errors = 0
    issued = 0

    async def worker(delay_s: float) -> None:
        nonlocal errors, issued
        client: Client | None = None
        await asyncio.sleep(delay_s)
        while time.perf_counter() < deadline and (total is None or issued < total):
            issued += 1
            try:
                if client is None or not client.usable:
                    client = await connect(target, record_gaps)
                samples.append(await client.request(raw, time.perf_counter()))
            except (ConnectionLost, OSError):
                errors += 1
                client = None
                await asyncio.sleep(0.01)
        if client is not None:
            client.close()

    hook = on_window or (lambda _: None)
    marks: list[str] = []

    def mark(name: str) -> None:
        marks.append(name)
        hook(name)

    async def window() -> None:
        await asyncio.sleep(warmup_s)
        mark("start")
        await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
        mark("end")

    timer = asyncio.create_task(window())
    tasks = [asyncio.create_task(worker(i * stagger_s / concurrency)) for i in range(concurrency)]
    await _wait_or_cancel(tasks, deadline - time.perf_counter() + grace_s)
    end = min(time.perf_counter(), deadline)
    if not timer.done():
        timer.cancel()
        for name in ("start", "end"):
            if name not in marks:
                mark(name)
    if total is not None:
        window_start = start
    counted = [s for s in samples if window_start <= s.done <= end]
    result = _collect(counted, target, max(end - window_start, 1e-9))
    if errors:
        result.count_error("connection", errors)
    return result


async def open_loop(
    target: Target, rate: float, duration_s: float, *, max_connections: int = 512, warm_connections: int = 8
) -> Result:
    """Start requests at a fixed rate whatever the answers do: a stalled proxy meets new requests on new
    connections, so its queueing shows in the latencies. Latency counts from the actual send, so the
    event loop's timer granularity (1 ms in libuv) does not pose as proxy latency."""
    raw = target.request_bytes()
    idle = [await connect(target, False) for _ in range(warm_connections)]
    open_count = len(idle)
    samples: list[Sample] = []
    errors = 0

    async def one() -> None:
        nonlocal open_count, errors
        client = None
        while idle and client is None:
            candidate = idle.pop()
            client = candidate if candidate.usable else None
        try:
            if client is None:
                if open_count >= max_connections:
                    errors += 1
                    return
                open_count += 1
                client = await connect(target, False)
            samples.append(await client.request(raw, time.perf_counter()))
            idle.append(client)
        except (ConnectionLost, OSError):
            errors += 1
            open_count -= 1

    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * duration_s)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await _wait_or_cancel(tasks, 10.0)
    for client in idle:
        client.close()
    result = _collect(samples, target, duration_s)
    if errors:
        result.count_error("connection", errors)
    return result


async def _wait_or_cancel(tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(timeout_s, 0.1))
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


def _collect(samples: list[Sample], target: Target, window_s: float) -> Result:
    result = Result(window_s=window_s)
    for sample in samples:
        result.add(sample, target.stream, target.min_events)
    return result
