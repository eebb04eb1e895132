"""The bounded, deadline-aware wait per route: where a request waits when every candidate is full or
paused by an upstream rate limit, until the first one frees, or until its route's bound (then 429).

Waiters are served one at a time in the route's order (arrival, or nearest deadline): only the head
re-decides, so a freed slot goes to whoever has waited longest (or must leave soonest).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from gateway.errors import BackendsBusy
from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision

# Real seconds between looks when nothing was notified: a rate-limit pause ends on the clock alone.
POLL_S = 0.02
# What a candidate may be blocked by and still free up on its own.
TRANSIENT = ("at max concurrency", "paused by an upstream rate limit")


@dataclass(order=True)
class _Waiter:
    key: tuple[float, int]
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


def retry_after_seconds(value: str | None, wall_now: float, default_s: float = 1.0) -> float:
    """An upstream's Retry-After (seconds, or an HTTP date) as seconds from now."""
    if not value:
        return default_s
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - wall_now)
    except (TypeError, ValueError):
        return default_s


def worth_waiting(decision: Decision) -> bool:
    """Whether some eligible-by-nature candidate is held back only by load or a rate limit."""
    return any(e.blocked_by and all(b.startswith(TRANSIENT) for b in e.blocked_by) for e in decision.evals)


class WaitingRoom:
    """Every route's queue of waiting requests, for one process."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._queues: dict[str, list[_Waiter]] = {}
        self._seq = itertools.count()
        self.waited_s: dict[str, float] = {}  # by route, for metrics
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (route, "served" | "refused")

    def waiting(self) -> dict[str, int]:
        return {route: len(queue) for route, queue in self._queues.items()}

    def notify(self) -> None:
        """Something may have freed (an attempt ended): every route's head looks again."""
        for queue in self._queues.values():
            if queue:
                queue[0].wake.set()

    async def wait(
        self,
        route: CompiledRoute,
        deadline: float,
        budget_s: float,
        redecide: Callable[[], Decision],
        retry_after_s: Callable[[], float],
    ) -> tuple[Decision, float]:
        """Wait until ``redecide`` names a candidate; returns it and the seconds waited. At most
        ``budget_s`` (what is left of the route's ``waiting.max_wait_s``) and never past ``deadline``;
        past that, or with the queue full, ``BackendsBusy`` (429 with Retry-After)."""
        settings = route.waiting
        queue = self._queues.setdefault(route.name, [])
        started = self._clock()
        until = min(started + budget_s, deadline)
        if budget_s <= 0 or len(queue) >= settings.max_waiting or until <= started:
            self.outcomes[route.name, "refused"] += 1
            raise BackendsBusy(
                f"route '{route.name}': every candidate is busy or rate-limited and no place to wait is left",
                retry_after_s=retry_after_s(),
            )
        order_key = deadline if settings.order == "deadline" else started
        waiter = _Waiter((order_key, next(self._seq)))
        queue.append(waiter)
        queue.sort()
        try:
            while True:
                if queue[0] is waiter:
                    decision = redecide()
                    if decision.order:
                        waited = self._clock() - started
                        self.waited_s[route.name] = self.waited_s.get(route.name, 0.0) + waited
                        self.outcomes[route.name, "served"] += 1
                        return decision, waited
                if self._clock() >= until:
                    self.waited_s[route.name] = self.waited_s.get(route.name, 0.0) + self._clock() - started
                    self.outcomes[route.name, "refused"] += 1
                    raise BackendsBusy(
                        f"route '{route.name}': every candidate stayed busy or rate-limited for the "
                        f"{settings.max_wait_s:g}s the route lets a request wait",
                        retry_after_s=retry_after_s(),
                    )
                waiter.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wake.wait(), POLL_S)
        finally:
            queue.remove(waiter)
            if queue:
                queue[0].wake.set()  # the next in line looks at once
