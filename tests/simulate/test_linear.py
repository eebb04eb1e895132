"""The simulator's queues cost the same per request however long they grow: work measured by
deterministic counters (comparisons the queue makes, lines its code runs), never by a clock, at n and
4n queued requests. A queue that pays its length per departure (a ``deque.remove`` or a scan for the
leaving entry) does 16 times the work at 4n; these allow 6."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from gateway.emulator import PROFILES
from gateway.policy.decide import CandidateEval, Decision
from gateway.policy.schema import Slo, Waiting
from gateway.simulate import backends as backends_module
from gateway.simulate import waiting as waiting_module
from gateway.simulate.backends import BackendModel, FailureKind, Job
from gateway.simulate.timeline import Timeline
from gateway.simulate.waiting import SimWaitingRoom
from tests.simulate.tiny import tiny_policy

LINEAR_ENOUGH = 6.0  # work(4n) / work(n): 4 when linear, 16 when each departure scans the queue


class CountingJob(Job):
    """A job that counts how often a queue compares it with another (``deque.remove`` does)."""

    __slots__ = ()
    comparisons = 0

    def __eq__(self, other: object) -> bool:
        CountingJob.comparisons += 1
        return self is other

    __hash__ = Job.__hash__


@contextmanager
def lines_run_in(module: Any) -> Iterator[list[int]]:
    """Counts the lines of ``module``'s code that run inside the block (a deterministic work count)."""
    count = [0]
    filename = module.__file__

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event == "line":
            count[0] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return local if frame.f_code.co_filename == filename else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield count
    finally:
        sys.settrace(previous)


class Sink:
    def first_token(self, job: Job) -> None: ...

    def finished(self, job: Job) -> None: ...

    def failed(self, job: Job, kind: FailureKind) -> None: ...


def backend_queue_work(n: int) -> int:
    """One seat held by a long stream, ``n`` jobs queued behind it, cancelled newest first (as
    fallback attempts with less of their deadline left give up before those ahead of them)."""
    timeline = Timeline()
    profile = PROFILES["b300-vllm"].with_overrides({"max_running": 1})
    model = BackendModel("pool", profile, timeline, random.Random(0), Sink())
    model.submit(Job(10, 1_000_000, None))
    queued = [CountingJob(10, 10, i) for i in range(n)]
    CountingJob.comparisons = 0
    with lines_run_in(backends_module) as lines:
        for job in queued:
            model.submit(job)
        for job in reversed(queued):
            model.cancel(job)
    assert not model.waiting
    return CountingJob.comparisons + lines[0]


@pytest.mark.pure_python  # counts the lines run in backends.py: a compiled module runs none
def test_a_backend_queue_cancelled_out_of_order_costs_linear_work() -> None:
    small, large = backend_queue_work(500), backend_queue_work(2000)
    assert large / small <= LINEAR_ENOUGH, (small, large)


def held_at_max_concurrency(name: str) -> Decision:
    slo = Slo()
    blocked = CandidateEval(
        name, False, True, True, None, None, None, 0.0, None, None, 0.0, False, None, None, None, 0, None,
        ("at max concurrency",), slo,
    )  # fmt: skip
    return Decision((), "rejected_no_feasible", (blocked,))


def waiting_room_work(n: int, tmp_path: Path) -> int:
    """``n`` requests wait in deadline order, the later arrivals with the nearer deadlines, and each
    gives up after ``max_wait_s``: they leave in arrival order, from the back of the queue."""
    route = tiny_policy(tmp_path).routes["r"]
    route = dataclasses.replace(
        route, waiting=Waiting(max_wait_s=10.0, max_waiting=100_000, order="deadline")
    )
    timeline = Timeline()
    refused: list[int] = []
    decision = held_at_max_concurrency("pool")
    room = SimWaitingRoom(timeline, lambda r: decision, lambda r, d: None, refused.append)
    with lines_run_in(waiting_module) as lines:
        for i in range(n):
            timeline.now = i * 1e-3
            assert room.enter(i, route, decision, deadline=5_000.0 - i) is None
        timeline.drain()
    assert refused == list(range(n))
    return lines[0]


@pytest.mark.pure_python  # counts the lines run in waiting.py
def test_a_waiting_room_left_from_the_back_costs_linear_work(tmp_path: Path) -> None:
    small, large = waiting_room_work(500, tmp_path), waiting_room_work(2000, tmp_path)
    assert large / small <= LINEAR_ENOUGH, (small, large)
