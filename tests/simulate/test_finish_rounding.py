"""A backend model's finish event finishes the stream it was planned for, however large the progress has
grown. Late in a simulated week a stream's progress (tokens one stream has made since the start) is ~3e7,
where a float's step (~3.7e-9) is past the 1e-9 margin a finish is checked with, and the planned wait
(a step over the decode speed) is below the clock's own step at ~5e5 s: the stream was found one step
short, planned again at the same instant, and so on (kimi-week ran 28 million such events)."""

from __future__ import annotations

import heapq
import math
import random

from gateway.emulator.profiles import PROFILES
from gateway.simulate.backends import BackendModel, Job, JobState
from gateway.simulate.timeline import Timeline
from tests.simulate.test_linear import Sink

EVENTS_ENOUGH = 100


def state_of(job: Job) -> JobState:
    return job.state  # read afresh: the events change it


def test_a_stream_one_float_step_short_of_its_target_finishes_at_its_planned_event() -> None:
    timeline = Timeline()
    timeline.now = 6.0e5  # the end of a week: the clock's step is ~1.2e-10 s
    model = BackendModel("pool", PROFILES["b300-vllm"], timeline, random.Random(0), Sink())
    progress = 3.0e7
    model._progress, model._progress_at = progress, timeline.now
    job = Job(10, 100, None)
    job.state = "decode"
    job.target = math.nextafter(progress, math.inf)  # one float step on: ~3.7e-9 tokens
    model.running[job] = None
    planned_wait = (job.target - progress) / model.per_stream_tokens_per_s()
    assert job.target - progress > 1e-9 and timeline.now + planned_wait == timeline.now
    heapq.heappush(model._decoding, (job.target, 0, job))
    model._reschedule()

    events = timeline._events
    taken = 0
    while events and state_of(job) == "decode" and taken < EVENTS_ENOUGH:
        at, _, action, args = heapq.heappop(events)
        timeline.now = at
        action(*args)
        taken += 1
    assert state_of(job) == "done", f"still decoding after {taken} events at the same instant"
    assert taken == 1
