"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the ``traceparent`` a client sends, read and
written, new trace and span ids, and the sampler's choice."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

# Ids need to be unique, not secret: one seeded generator, not a syscall per id (as OpenTelemetry's
# own RandomIdGenerator does).
_ids: Final = random.Random(os.urandom(16))
TRACE_ID_LOW_BOUND: Final = 1 << 64
SAMPLED: Final = 0x01


def new_trace_id() -> bytes:
    value = _ids.getrandbits(128)
    return value.to_bytes(16, "big") if value else new_trace_id()


def new_span_id() -> bytes:
    value = _ids.getrandbits(64)
    return value.to_bytes(8, "big") if value else new_span_id()


@dataclass(frozen=True, slots=True)
class ParentContext:
    """A client's span context, as its traceparent said."""

    trace_id: bytes
    span_id: bytes
    sampled: bool
    trace_state: str


def parse_traceparent(value: str | None, trace_state: str | None) -> ParentContext | None:
    """The client's ``traceparent`` (version 00, or a later one read as 00 says); None when absent or
    malformed (a new trace then starts, as the spec asks)."""
    if value is None:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if len(trace_hex) != 32 or len(span_hex) != 16 or len(flags_hex) != 2:
        return None
    try:
        trace_id, span_id, flags = bytes.fromhex(trace_hex), bytes.fromhex(span_hex), int(flags_hex, 16)
        int(version, 16)
    except ValueError:
        return None
    if trace_id == bytes(16) or span_id == bytes(8) or trace_hex != trace_hex.lower():
        return None
    state = (trace_state or "").strip()
    # Passed on to engines in a header of our own writing: printable ASCII only, and bounded (W3C: 512).
    if len(state) > 512 or not (state.isascii() and state.isprintable()):
        state = ""
    return ParentContext(trace_id, span_id, bool(flags & SAMPLED), state)


def trace_headers(raw: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """The request's ``traceparent`` and ``tracestate`` from its ASGI headers (names lower case), in
    one pass: a lookup by name in Starlette's ``Headers`` raises and catches a KeyError for each header
    a request lacks, which most lack (~1 us each on the request path)."""
    parent = state = None
    for name, value in raw:
        if name[:5] == b"trace":
            if name == b"traceparent":
                parent = value.decode("latin-1")
            elif name == b"tracestate":
                state = value.decode("latin-1")
    return parent, state


def traceparent(trace_id: bytes, span_id: bytes, sampled: bool) -> str:
    return f"00-{trace_id.hex()}-{span_id.hex()}-{'01' if sampled else '00'}"


@dataclass(frozen=True, slots=True)
class Sampler:
    """OpenTelemetry's samplers by their OTEL_TRACES_SAMPLER names: ``ratio`` of new traces kept
    (always_on 1, always_off 0), and whether a client's sampled flag is followed (``parentbased_*``)."""

    ratio: float = 1.0
    parent_based: bool = True

    def keeps(self, trace_id: bytes, parent: ParentContext | None) -> bool:
        if parent is not None and self.parent_based:
            return parent.sampled
        # traceidratio: the trace id's low 64 bits below the ratio's share (the SDK's TraceIdRatioBased).
        return int.from_bytes(trace_id[8:], "big") < self.ratio * TRACE_ID_LOW_BOUND
