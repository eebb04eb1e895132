"""The start of a new upstream stream: read until its first complete event, measured on the way. Until
then nothing has reached the client, so a failure can still go to another backend (the proxy's fallback,
the resume of a cut stream)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.backends import UpstreamCall
from gateway.backends.base import Upstream
from gateway.errors import AttemptFailure
from gateway.measure.meter import StreamMeter

Clock = Callable[[], float]


async def first_events(
    upstream: Upstream, meter: StreamMeter, call: UpstreamCall, clock: Clock
) -> tuple[bytes, bytes]:
    """Read a new stream until its first complete event: until then a failure can still go elsewhere.
    Returns that event (the first ones the meter kept) and the rest of the read it came in, unmeasured:
    the client gets its first token without waiting for the meter to parse a read that holds many
    events (a fast upstream's whole answer, ~1 us per event); whoever relays the stream feeds the rest
    to the meter before anything else."""
    first = rest = b""

    def take(data: bytes) -> bool:
        nonlocal first, rest
        while True:
            cut = _first_event_end(data)
            piece, data = (data[:cut], data[cut:]) if 0 < cut < len(data) else (data, b"")
            first = meter.feed(piece, clock())
            if first or not data or meter.failure(call.backend.name) is not None:
                break
        rest = data if first else b""
        return not first and meter.failure(call.backend.name) is None

    try:
        async with asyncio.timeout(call.wait_s):
            while not first:
                ended = await upstream.push(take)
                # Broken before the client saw a byte (its first read may hold tokens, then an error
                # event): the whole answer can still come from elsewhere.
                broken = meter.failure(call.backend.name)
                if broken is not None:
                    raise broken
                if ended and not first:
                    raise AttemptFailure(
                        "dropped", f"{call.backend.name}: stream ended before its first event"
                    )
    except TimeoutError:
        raise AttemptFailure("timeout", f"{call.backend.name}: no first token in {call.wait_s:g}s") from None
    return first, rest


def _first_event_end(data: bytes) -> int:
    """Where the first event of ``data`` ends (past its blank line, LF or CRLF), or 0 if none does. Any
    cut is correct (the meter joins an event cut by a read); this one only keeps the first event short."""
    end = data.find(b"\n\n")
    if end >= 0:
        return end + 2
    end = data.find(b"\r\n\r\n")
    return end + 4 if end >= 0 else 0
