"""A new stream's first event goes on alone (``request/first_events.py``): a read that holds many events
(a fast upstream's whole answer) is cut after the first one the meter keeps, and the rest of that read
is handed back unmeasured, for the relay to feed on before any later read. Cut or not, the meter sees
every byte, once, in order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.backends.base import Take
from gateway.measure.meter import StreamMeter
from gateway.request.first_events import first_events
from gateway.values.observation import Attempt


class Reads:
    """An upstream whose body arrives in the given reads, handed to ``push`` one at a time."""

    def __init__(self, *reads: bytes) -> None:
        self.reads = list(reads)

    async def push(self, take: Take) -> bool:
        while self.reads:
            if not take(self.reads.pop(0)):
                return False
        return True


def event(n: int, sep: bytes = b"\n\n") -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}' % n + sep


CALL: Any = SimpleNamespace(backend=SimpleNamespace(name="b"), wait_s=5.0)


def metered() -> StreamMeter:
    return StreamMeter(Attempt(backend="b", started_at=0.0), client_wants_usage=False, prompt_tokens=1)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
async def test_the_first_event_of_a_read_of_many_goes_on_alone(sep: bytes) -> None:
    meter = metered()
    whole = event(1, sep) + event(2, sep) + event(3, sep) + b"data: [DONE]" + sep
    first, rest = await first_events(Reads(whole), meter, CALL, lambda: 1.0)  # type: ignore[arg-type]
    assert first == event(1, sep) and rest == whole[len(first) :]
    assert meter.answer_chunks == 1 and not meter.saw_done()  # the rest is not measured yet
    assert meter.feed(rest, 2.0) == rest and meter.answer_chunks == 3 and meter.saw_done()


async def test_an_event_cut_by_a_read_is_joined_before_the_cut() -> None:
    meter = metered()
    one, two = event(1), event(2)
    reads = Reads(one[:10], one[10:] + two)
    first, rest = await first_events(reads, meter, CALL, lambda: 1.0)  # type: ignore[arg-type]
    assert (first, rest) == (one, two)


async def test_events_the_meter_holds_back_are_read_past() -> None:
    """The usage-only chunk the gateway asked for itself is no first event: the read goes on to one."""
    meter = metered()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    reads = Reads(usage + event(1) + event(2))
    first, rest = await first_events(reads, meter, CALL, lambda: 1.0)  # type: ignore[arg-type]
    assert (first, rest) == (event(1), event(2))
