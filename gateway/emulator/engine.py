"""The emulated inference engine: seats and a FIFO queue, continuous-batching decode speed, token pacing.

Engine time is emulated seconds (``time_scale`` turns them into real ones); what it records is real seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from gateway.emulator.profiles import Profile

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
# Token pacing sleeps at least this long (real seconds) between bursts, and at most the second figure,
# so a stream notices quickly when other streams leave and its speed goes up.
MIN_SLEEP_S = 0.002
MAX_SLEEP_S = 0.05


@dataclass(frozen=True, slots=True)
class Plan:
    """What one request will generate, decided when it is accepted."""

    prompt_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    content_tokens: int
    extra_ttft_s: float = 0.0  # emulated seconds added before the first token (a fault knob)

    @property
    def total_tokens(self) -> int:
        return self.reasoning_tokens + self.content_tokens


@dataclass(eq=False, slots=True)
class Generation:
    """One request's life in the engine; times are real clock readings."""

    plan: Plan
    task_id: int
    queued_at: float
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    emitted: int = 0
    seat: int | None = None


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        return self.counts or [0] * len(self.bounds)


@dataclass(slots=True)
class Throughput:
    """Tokens and the real seconds they took; llama.cpp's rate buckets, emptied on each /metrics read."""

    tokens: int = 0
    seconds: float = 0.0

    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0  # left a seat, for whatever reason
    completed: int = 0  # left a seat with every planned token generated
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    prompt_bucket: Throughput = field(default_factory=Throughput)
    generation_bucket: Throughput = field(default_factory=Throughput)


class Engine:
    """Seats (running requests), a FIFO queue for the rest, and a shared decode clock.

    Every running request decodes at the same per-stream speed, which depends on how many are running.
    ``_progress`` integrates that speed over emulated time (tokens one stream has produced since the
    engine started); a stream's tokens due are the growth of ``_progress`` since its first token. The
    integral is brought up to date before the running count or the slowdown changes, so speed changes
    apply from the moment they happen.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        time_scale: float,
        clock: Callable[[], float],
        rng: random.Random,
        cold_boot: bool,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.profile = profile
        self.time_scale = time_scale
        self.totals = Totals()
        self._clock = clock
        self._rng = rng
        self._started_at = clock()
        self._boot_s = profile.cold_boot_s if cold_boot else 0.0
        self._seats: list[Generation | None] = [None] * (profile.max_running or 0)
        self._last_in_seat: list[Generation | None] = list(self._seats)
        self._running: set[Generation] = set()
        self._waiting: OrderedDict[Generation, asyncio.Future[None]] = OrderedDict()
        self._slowdown = 1.0
        self._seat_limit: int | None = None  # the faults' limit, below the profile's
        self._progress = 0.0
        self._progress_at = self.now()
        self._next_task_id = 0

    # -- time ----------------------------------------------------------------------------------------

    def now(self) -> float:
        """Emulated seconds since the engine started."""
        return (self._clock() - self._started_at) / self.time_scale

    def real_s(self, emulated_s: float) -> float:
        return emulated_s * self.time_scale

    @property
    def booting(self) -> bool:
        return self.now() < self._boot_s

    @property
    def loading(self) -> bool:
        """Booting and not yet warming up: the weights are still loading."""
        return self.loading_left_s() > 0

    def loading_left_s(self) -> float:
        """Emulated seconds until the weights are loaded; 0 when they are."""
        return max(0.0, self._boot_s - self.profile.warmup_s - self.now())

    def boot_for(self, emulated_s: float) -> None:
        """Start a cold boot now (a restart): not ready for ``emulated_s`` emulated seconds."""
        self._boot_s = self.now() + emulated_s

    # -- load ----------------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def per_stream_tokens_per_s(self) -> float:
        """Current decode speed of each running stream, in emulated tokens per second."""
        return self.profile.per_stream_tokens_per_s(len(self._running)) / self._slowdown

    def set_seats(self, seats: int | None) -> None:
        self._seat_limit = seats

    def set_slowdown(self, factor: float) -> None:
        self._advance()
        self._slowdown = factor

    def kv_tokens(self) -> int:
        return sum(g.plan.prompt_tokens + g.emitted for g in self._running)

    def seats(self) -> list[tuple[Generation | None, Generation | None]]:
        """(current, previous) occupant of each seat, for llama.cpp's /slots."""
        return list(zip(self._seats, self._last_in_seat, strict=True))

    def take_throughput_buckets(self) -> tuple[Throughput, Throughput]:
        """The prompt and generation buckets since the last call, as llama.cpp empties them on read."""
        taken = (self.totals.prompt_bucket, self.totals.generation_bucket)
        self.totals.prompt_bucket, self.totals.generation_bucket = Throughput(), Throughput()
        return taken

    # -- generation ----------------------------------------------------------------------------------

    def generation(self, plan: Plan) -> Generation:
        self._next_task_id += 1
        self.totals.requests += 1
        return Generation(plan=plan, task_id=self._next_task_id, queued_at=self._clock())

    async def run(self, gen: Generation) -> AsyncGenerator[int, None]:
        """Wait for a seat and the first token, then yield how many new tokens are due, burst by burst."""
        try:
            await self._admit(gen)
            gen.admitted_at = self._clock()
            plan = gen.plan
            self.totals.prompt_tokens += plan.prompt_tokens
            self.totals.cached_prompt_tokens += plan.cached_tokens
            uncached = plan.prompt_tokens - plan.cached_tokens
            await self._sleep(self.profile.ttft_s(uncached, self._rng) + plan.extra_ttft_s)
            gen.first_token_at = self._clock()
            self.totals.ttft.observe(gen.first_token_at - gen.queued_at)
            async with contextlib.aclosing(self._decode(gen)) as bursts:
                async for burst in bursts:
                    yield burst
        finally:
            self._finish(gen)

    async def _decode(self, gen: Generation) -> AsyncGenerator[int, None]:
        total = gen.plan.total_tokens
        start = self._advance()
        while gen.emitted < total:
            produced = self._advance() - start
            due = min(total, 1 + math.floor(produced))
            if due > gen.emitted:
                burst = due - gen.emitted
                gen.emitted = due
                gen.last_token_at = self._clock()
                self.totals.generation_tokens += burst
                yield burst
                continue
            wait_s = self.real_s((gen.emitted - produced) / self.per_stream_tokens_per_s())
            await asyncio.sleep(min(max(wait_s, MIN_SLEEP_S), MAX_SLEEP_S))

    async def _sleep(self, emulated_s: float) -> None:
        if emulated_s > 0:
            await asyncio.sleep(self.real_s(emulated_s))

    def _advance(self) -> float:
        now = self.now()
        self._progress += (now - self._progress_at) * self.per_stream_tokens_per_s()
        self._progress_at = now
        return self._progress

    # -- seats and queue -----------------------------------------------------------------------------

    def _has_free_seat(self) -> bool:
        limits = [n for n in (self.profile.max_running, self._seat_limit) if n is not None]
        return not limits or len(self._running) < min(limits)

    async def _admit(self, gen: Generation) -> None:
        if self._has_free_seat() and not self._waiting:
            self._occupy(gen)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[gen] = granted
        await granted  # a cancelled waiter is cleaned up by _finish

    def _occupy(self, gen: Generation) -> None:
        self._advance()
        self._running.add(gen)
        if self._seats:
            gen.seat = self._seats.index(None)
            self._seats[gen.seat] = gen
            self._last_in_seat[gen.seat] = gen

    def _finish(self, gen: Generation) -> None:
        waiter = self._waiting.pop(gen, None)
        if waiter is not None:
            waiter.cancel()
        if gen not in self._running:
            return
        self._advance()
        self._running.discard(gen)
        if gen.seat is not None:
            self._seats[gen.seat] = None
        self._account(gen)
        while self._waiting and self._has_free_seat():
            nxt, granted = self._waiting.popitem(last=False)
            if not granted.done():
                self._occupy(nxt)
                granted.set_result(None)

    def _account(self, gen: Generation) -> None:
        totals = self.totals
        totals.finished += 1
        if gen.first_token_at is not None and gen.emitted >= gen.plan.total_tokens:
            totals.completed += 1
        if gen.admitted_at is not None and gen.first_token_at is not None:
            uncached = gen.plan.prompt_tokens - gen.plan.cached_tokens
            prompt_s = gen.first_token_at - gen.admitted_at
            totals.prompt_seconds += prompt_s
            totals.prompt_bucket.tokens += uncached
            totals.prompt_bucket.seconds += prompt_s
        if gen.first_token_at is not None and gen.last_token_at is not None:
            generation_s = gen.last_token_at - gen.first_token_at
            totals.generation_seconds += generation_s
            totals.generation_bucket.tokens += gen.emitted
            totals.generation_bucket.seconds += generation_s
