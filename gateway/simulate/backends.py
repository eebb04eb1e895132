"""Backends as performance models: the emulators' engine (seats, a FIFO queue, continuous batching,
TTFT with its spread and prefill of the uncached prompt, a prefix cache) in virtual time, driven by the
same ``Profile`` the emulators use.

Every running stream decodes at ``profile.per_stream_tokens_per_s(running)``; the model integrates
that speed (``progress``: tokens one stream has made since the start) and keeps decoding streams on a
heap by the progress at which they finish, so a finish costs O(log n) whatever the load.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from typing import Any, Literal, Protocol

from gateway.emulator.profiles import Profile
from gateway.simulate.caches import PrefixCacheModel, cache_for
from gateway.simulate.timeline import Timeline
from gateway.simulate.workload import Fault, PromptShape

JobState = Literal["new", "waiting", "prefill", "decode", "done", "failed", "cancelled"]
FailureKind = Literal["connect_error", "upstream_error", "dropped"]


class Job:
    """One attempt on one backend; ``owner`` is whatever the engine hangs on it."""

    __slots__ = ("added_ttft_s", "admitted_at", "cached_tokens", "first_token_at", "generated_tokens",
                 "http_status", "output_tokens", "owner", "prompt_tokens", "reasoning_tokens", "shape",
                 "state", "submitted_at", "target")  # fmt: skip

    def __init__(
        self, prompt_tokens: int, output_tokens: int, owner: Any, shape: PromptShape | None = None
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.shape = shape  # message boundaries for the backend's prefix cache (caches.py)
        self.cached_tokens = 0  # found in that cache when it was seated: only the rest is prefilled
        self.output_tokens = output_tokens
        self.owner = owner
        self.state: JobState = "new"
        self.submitted_at = 0.0
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.target = 0.0  # the progress at which its last token is out
        self.http_status: int | None = None
        self.added_ttft_s = 0.0  # a slow spell's delay, fixed when it arrives (as the emulator does)
        self.generated_tokens = 0  # made before a fault cut it (a cut stream's, for its resume)
        self.reasoning_tokens = 0  # of ``output_tokens``, thinking (the engine's to set)


class JobSink(Protocol):
    """Where a backend model reports what happens to its jobs (the engine)."""

    def first_token(self, job: Job) -> None: ...

    def finished(self, job: Job) -> None: ...

    def failed(self, job: Job, kind: FailureKind) -> None: ...


class BackendModel:
    """One backend in virtual time. Faults: ``down`` (refuses, drops what it held), ``booting``
    (answers 503), ``slowdown``/``added_ttft_s`` (a slow window), ``error_rate`` (HTTP 500s)."""

    def __init__(self, name: str, profile: Profile, timeline: Timeline, rng: random.Random, sink: JobSink):
        self.name = name
        self.profile = profile
        self.timeline = timeline
        self.rng = rng
        self.sink = sink
        # Seated: prefilling or decoding (both count for batching). A dict, not a set: a set of jobs
        # iterates in the order of their addresses, so a pool's death failed its streams (and their
        # resumes went) in an order that changed from run to run.
        self.running: dict[Job, None] = {}
        # The FIFO queue for a seat. A job cancelled while queued stays in it, marked, and is skipped
        # when it reaches the head (a removal from the middle would cost the queue's length).
        self._queue: deque[Job] = deque()
        self.waiting = 0  # jobs queued and not cancelled
        self._decoding: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self._progress = 0.0
        self._progress_at = 0.0
        self._version = 0
        self.down = False
        self.booting = False
        self.slowdown = 1.0
        self.added_ttft_s = 0.0
        self.error_rate = 0.0
        self.generated_tokens = 0
        self.cache: PrefixCacheModel | None = cache_for(profile)

    # -- what the gateway's scraper would read ------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return not self.down and not self.booting

    def per_stream_tokens_per_s(self) -> float:
        return self.profile.per_stream_tokens_per_s(len(self.running)) / self.slowdown

    # -- requests -----------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        now = self.timeline.now
        job.submitted_at = now
        job.added_ttft_s = self.added_ttft_s
        if self.down:
            self._fail_soon(job, "connect_error", None)
        elif self.booting:
            self._fail_soon(job, "upstream_error", 503)
        elif self.error_rate > 0 and self.rng.random() < self.error_rate:
            self._fail_soon(job, "upstream_error", 500)
        elif self._has_free_seat() and not self.waiting:
            self._occupy(job)
        else:
            job.state = "waiting"
            self._queue.append(job)
            self.waiting += 1

    def cancel(self, job: Job) -> None:
        """The client (the gateway's timeout) hung up: free its seat or its place in the queue."""
        state = job.state
        job.state = "cancelled"
        if state == "waiting":
            self.waiting -= 1
            if len(self._queue) > 2 * self.waiting + 64:  # mostly cancelled: drop them in one pass
                self._queue = deque(j for j in self._queue if j.state == "waiting")
        elif state in ("prefill", "decode"):
            self._leave(job)

    def set_slowdown(self, factor: float) -> None:
        self._advance()
        self.slowdown = factor
        self._reschedule()

    def apply_fault(self, fault: Fault, on: bool) -> None:
        """A workload's fault window begins (``on``) or ends."""
        if fault.kind == "down":
            self.down = on
            if on:
                self.fail_everything("connect_error")
        elif fault.kind == "booting":
            self.booting = on
            if on:
                self.fail_everything("upstream_error")
        elif fault.kind == "slow":
            self.set_slowdown(fault.slowdown if on else 1.0)
            self.added_ttft_s = fault.added_ttft_ms / 1000.0 if on else 0.0
        else:
            self.error_rate = fault.error_rate if on else 0.0

    def fail_everything(self, kind: FailureKind) -> None:
        """The server died or restarted: every request it held ends now."""
        progress = self._advance()
        held = [*(j for j in self._queue if j.state == "waiting"), *self.running]
        for job in self.running:
            if job.state == "decode":  # the first token, and what decoded since
                made = job.output_tokens - (job.target - progress)
                job.generated_tokens = max(1, min(job.output_tokens, int(made)))
        self._queue.clear()
        self.waiting = 0
        self.running.clear()
        self._decoding.clear()
        self._reschedule()
        for job in held:
            self._fail_soon(job, "dropped" if job.state == "decode" else kind, None)

    # -- the engine ---------------------------------------------------------------------------------

    def _has_free_seat(self) -> bool:
        limit = self.profile.max_running
        return limit is None or len(self.running) < limit

    def _fail_soon(self, job: Job, kind: FailureKind, http_status: int | None) -> None:
        job.state = "failed"
        job.http_status = http_status
        self.timeline.schedule(self.timeline.now, self.sink.failed, job, kind)

    def _occupy(self, job: Job) -> None:
        self._advance()
        self.running[job] = None
        job.state = "prefill"
        job.admitted_at = self.timeline.now
        if self.cache is not None and job.shape is not None:
            job.cached_tokens = self.cache.serve(job.shape, job.prompt_tokens, self.timeline.now)
        ttft = self.profile.ttft_s(job.prompt_tokens - job.cached_tokens, self.rng) + job.added_ttft_s
        self.timeline.schedule(self.timeline.now + ttft, self._first_token, job)
        self._reschedule()

    def _first_token(self, job: Job) -> None:
        if job.state != "prefill":
            return  # cancelled or failed while prefilling
        progress = self._advance()
        job.state = "decode"
        job.first_token_at = self.timeline.now
        job.target = progress + max(0, job.output_tokens - 1)
        heapq.heappush(self._decoding, (job.target, next(self._seq), job))
        self.sink.first_token(job)
        self._reschedule()

    def _advance(self) -> float:
        now = self.timeline.now
        if now > self._progress_at:
            self._progress += (now - self._progress_at) * self.per_stream_tokens_per_s()
            self._progress_at = now
        return self._progress

    def _reschedule(self) -> None:
        """Plan the next finish at the current speed; any earlier plan is void (the version moved)."""
        self._version += 1
        heap = self._decoding
        while heap and heap[0][2].state != "decode":
            heapq.heappop(heap)
        if not heap:
            return
        wait = (heap[0][0] - self._progress) / self.per_stream_tokens_per_s()
        self.timeline.schedule(self.timeline.now + max(0.0, wait), self._finish_due, self._version)

    def _finish_due(self, version: int) -> None:
        if version != self._version:
            return
        progress = self._advance() + 1e-9
        heap = self._decoding
        # The plan was made for the head's finish (any change since moved the version): it is due
        # now, even when rounding left the progress a little short of its target. (Late in a week the
        # progress is ~3e7 and its float step, 3.7e-9, is past the margin: kimi-week ran millions of
        # events that found the head one step short and planned it again.)
        if heap and heap[0][0] > progress and heap[0][2].state == "decode":
            progress = heap[0][0]
        done = []
        while heap and heap[0][0] <= progress:
            job = heapq.heappop(heap)[2]
            if job.state == "decode":
                done.append(job)
        for job in done:
            job.state = "done"
            self.generated_tokens += job.output_tokens
            self.running.pop(job, None)
        self._seat_waiting()
        self._reschedule()
        for job in done:
            self.sink.finished(job)

    def _leave(self, job: Job) -> None:
        self._advance()
        self.running.pop(job, None)
        self._seat_waiting()
        self._reschedule()

    def _seat_waiting(self) -> None:
        queue = self._queue
        while self.waiting and self._has_free_seat():
            job = queue.popleft()
            if job.state == "waiting":  # else cancelled while it queued
                self.waiting -= 1
                self._occupy(job)
