"""A plain OTLP/HTTP receiver for the tests that need no trace store: it keeps every body it is posted
(or refuses, or hangs, as a test asks), and reads the spans back with a protobuf wire-format reader of
its own, written from opentelemetry-proto's .proto files (the gateway's writer is checked against a real
store, Phoenix, in test_phoenix.py)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.telemetry.context import Sampler
from gateway.telemetry.settings import TelemetrySettings
from tests.servers import ThreadedServer, threaded_server

Fields = dict[int, list[Any]]


def fields(data: bytes) -> Fields:
    """One message's fields by number: varints as ints, fixed64/32 as raw bytes, the rest as bytes."""
    out: Fields = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire_type = key >> 3, key & 7
        value: Any
        if wire_type == 0:
            value, i = _varint(data, i)
        elif wire_type == 1:
            value, i = data[i : i + 8], i + 8
        elif wire_type == 5:
            value, i = data[i : i + 4], i + 4
        elif wire_type == 2:
            length, i = _varint(data, i)
            value, i = data[i : i + length], i + length
        else:
            raise ValueError(f"wire type {wire_type}")
        out.setdefault(number, []).append(value)
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, i


def any_value(data: bytes) -> Any:
    f = fields(data)
    if 1 in f:
        return f[1][0].decode()
    if 2 in f:
        return bool(f[2][0])
    if 3 in f:
        value = f[3][0]
        return value - (1 << 64) if value >= 1 << 63 else value
    if 4 in f:
        return struct.unpack("<d", f[4][0])[0]
    if 5 in f:
        return [any_value(v) for v in fields(f[5][0]).get(1, [])]
    return None


def attributes(raw: list[bytes]) -> dict[str, Any]:
    out = {}
    for kv in raw:
        f = fields(kv)
        out[f[1][0].decode()] = any_value(f[2][0]) if 2 in f else None
    return out


@dataclass
class ReadSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]
    status_code: int
    resource: dict[str, Any] = field(default_factory=dict)


def spans_of(body: bytes) -> list[ReadSpan]:
    """The spans of one ExportTraceServiceRequest."""
    out = []
    for resource_spans in fields(body).get(1, []):
        rs = fields(resource_spans)
        resource = attributes(fields(rs[1][0]).get(1, [])) if 1 in rs else {}
        for scope_spans in rs.get(2, []):
            for raw in fields(scope_spans).get(2, []):
                s = fields(raw)
                events = []
                for event in s.get(11, []):
                    e = fields(event)
                    events.append((e[2][0].decode(), attributes(e.get(3, []))))
                links = []
                for link in s.get(13, []):
                    lf = fields(link)
                    links.append((lf[1][0].hex(), lf[2][0].hex(), attributes(lf.get(4, []))))
                status = fields(s[15][0]).get(3, [0])[0] if 15 in s else 0
                out.append(
                    ReadSpan(
                        trace_id=s[1][0].hex(),
                        span_id=s[2][0].hex(),
                        parent_span_id=s[4][0].hex() if 4 in s else "",
                        name=s[5][0].decode(),
                        kind=s[6][0],
                        start_ns=struct.unpack("<Q", s[7][0])[0],
                        end_ns=struct.unpack("<Q", s[8][0])[0],
                        attributes=attributes(s.get(9, [])),
                        events=events,
                        links=links,
                        status_code=status,
                        resource=resource,
                    )
                )
    return out


class Receiver:
    """What an OTLP/HTTP receiver was posted; ``status`` is what it answers."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        self.status = 200

    async def traces(self, request: Request) -> Response:
        self.content_types.append(request.headers.get("content-type", ""))
        self.bodies.append(await request.body())
        return Response(b"", status_code=self.status, media_type="application/x-protobuf")

    def spans(self) -> list[ReadSpan]:
        return [span for body in list(self.bodies) for span in spans_of(body)]

    def wait_for(self, found: Callable[[list[ReadSpan]], bool], within_s: float = 20.0) -> list[ReadSpan]:
        deadline = time.monotonic() + within_s
        while True:
            spans = self.spans()
            if found(spans):
                return spans
            assert time.monotonic() < deadline, f"the receiver never got the spans: {spans}"
            time.sleep(0.05)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, ThreadedServer]]:
    receiver = Receiver()
    app = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    with threaded_server(app) as server:
        yield receiver, server


@contextlib.contextmanager
def hanging_receiver() -> Iterator[str]:
    """A receiver that accepts connections and reads, but never answers: the worst a collector can do."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def exporter_settings(url: str, batch_traces: int, flush_interval_s: float) -> TelemetrySettings:
    """An exporter's settings for a test that drives one itself, posting to ``url``'s /v1/traces."""
    return TelemetrySettings(
        endpoint=f"{url}/v1/traces",
        headers=(),
        sampler=Sampler(),
        service_name="test",
        content=False,
        max_queued_traces=100,
        batch_traces=batch_traces,
        flush_interval_s=flush_interval_s,
        export_timeout_s=5.0,
    )
