"""A finished request leaves nothing for the cyclic collector: its exchange and everything it held are
freed by reference counting the moment it settles, whichever way it ended (answered whole, streamed,
refused, left by its client mid-stream). ``gateway serve`` relies on it to make collections rare
(``gateway.process``); one reference cycle per request put ~50 objects per request on the collector and
cost ~8% of the CPU under load.

The collector is off while the requests run, so an exchange caught in a cycle stays in memory and is
found; a cycle is told apart from a live reference by collecting at the end: only a cycle is freed then.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest

from gateway.measure.meter import StreamMeter
from gateway.measure.transcript import Transcript
from gateway.request.connection import ClientWatch, DirectBody
from gateway.request.exchange import Exchange
from gateway.request.streaming import StreamRelay
from tests.conftest import Gateway, Upstreams
from tests.test_exchange import HELLO, LeavingClient, eventually, no_probes, set_faults

# ClientWatch and DirectBody: the connection's offers to each request, kept in its ASGI scope
HELD = (Exchange, StreamRelay, StreamMeter, Transcript, ClientWatch, DirectBody)
__all__ = ["no_probes"]  # the fixture, used by name


def held_objects() -> list[object]:
    return [o for o in gc.get_objects() if isinstance(o, HELD)]


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_probes", "collector_off")
def test_finished_requests_leave_no_reference_cycles(gateway: Gateway, upstreams: Upstreams) -> None:
    url = gateway.base_url + "/chat/completions"
    assert not held_objects(), "objects of an earlier test are still in memory"
    before = len(gateway.runtime.recent)
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            answer = client.post(url, json={"model": "vllm-only", "messages": HELLO})
            assert answer.status_code == 200, answer.text
            with client.stream(
                "POST", url, json={"model": "vllm-only", "messages": HELLO, "stream": True}
            ) as s:
                assert s.status_code == 200
                assert b"[DONE]" in b"".join(s.iter_bytes())
        refused = client.post(url, json={"model": "no-such-route", "messages": HELLO})
        assert refused.status_code == 404, refused.text
    set_faults(upstreams.vllm, reasoning_tokens=0, content_tokens=100_000)
    leaving = LeavingClient(gateway, {"model": "vllm-only", "messages": HELLO, "stream": True})
    leaving.read_until(b"data: ")
    leaving.leave()  # mid-stream: the relay is cancelled where it waits
    eventually(lambda: len(gateway.runtime.recent) >= before + 7, 10, "every routed request is settled")
    eventually(lambda: gateway.runtime.in_flight.count == 0, 5, "nothing in flight")

    all_freed()


@pytest.mark.usefixtures("no_probes", "collector_off")
def test_requests_whose_upstream_failed_leave_no_reference_cycles(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    # A failure is an exception, and a raised exception holds the frames it left: before, the wire's
    # response kept the very error it raised, so each stream cut mid-way left its
    # exchange, relay and meter in a cycle with its traceback.
    url = gateway.base_url + "/chat/completions"
    assert not held_objects(), "objects of an earlier test are still in memory"
    before = len(gateway.runtime.recent)
    body = {"model": "pool-then-api", "messages": HELLO, "stream": True}
    with httpx.Client(timeout=30) as client:
        set_faults(upstreams.vllm, drop_after_chunks=3)  # cut mid-stream (this policy resumes nowhere)
        for _ in range(3):
            with client.stream("POST", url, json=body) as s:
                assert s.status_code == 200
                assert b"upstream_stream_broken" in b"".join(s.iter_bytes())
        set_faults(upstreams.vllm, drop_after_chunks=None, error_rate=1.0)  # fails at the head: falls back
        for _ in range(3):
            answer = client.post(url, json={**body, "stream": False})
            assert answer.status_code == 200, answer.text
    eventually(lambda: len(gateway.runtime.recent) >= before + 6, 10, "every routed request is settled")
    eventually(lambda: gateway.runtime.in_flight.count == 0, 5, "nothing in flight")
    attempts = [len(o.attempts) for o in list(gateway.runtime.recent)[-6:]]
    # (the pool's circuit may open after its failures: then the last answers go to the API at once)
    assert attempts[:3] == [1, 1, 1] and attempts[3] == 2, "streams cut, an answer after a failed attempt"
    all_freed()


def all_freed() -> None:
    """Every object of the finished requests is freed (by reference counting: the collector is off)."""

    def nothing_held() -> bool:
        return not held_objects()

    try:
        eventually(nothing_held, 5, "the finished requests' objects are freed")
    except AssertionError:
        left = held_objects()
        count, kinds = len(left), sorted({type(o).__name__ for o in left})
        del left  # (its own references would keep them all)
        gc.collect()
        in_cycles = count - len(held_objects())
        raise AssertionError(
            f"{count} objects of finished requests are still in memory, {in_cycles} of them only "
            f"through reference cycles: {kinds}"
        ) from None
