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


async def first_events(upstream: Upstream, meter: StreamMeter, call: UpstreamCall, clock: Clock) -> bytes:
    """Read a new stream until its first complete event: until then a failure can still go elsewhere."""
    first = b""

    def take(data: bytes) -> bool:
        nonlocal first
        first = meter.feed(data, clock())
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
    return first
