"""The gateway's bounded wait queue in virtual time (``runtime/waiting.py``): a request whose candidates
are all full waits, per route in arrival or deadline order, for the first that frees, at most the
route's ``waiting.max_wait_s`` and ``waiting.max_waiting``; past the bound it is refused (429), so
``gateway simulate`` shows back-pressure as the gateway has it.

Each route's queue is a heap by (arrival or deadline, sequence) with the entries still waiting in a
dict by that key: a request that gives up is taken out of the dict (O(1)) and its heap entry skipped
when it reaches the head, so a long queue costs O(log n) per request, whatever order they leave in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision
from gateway.runtime.waiting import worth_waiting
from gateway.simulate.timeline import Timeline

Redecide = Callable[[Any], Decision]  # the waiting request -> a fresh decision for it
Proceed = Callable[[Any, Decision], None]
Key = tuple[float, int]


class _RouteQueue:
    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[Key] = []
        self.live: dict[Key, Any] = {}  # the requests still waiting, by their key


class SimWaitingRoom:
    def __init__(
        self, timeline: Timeline, redecide: Redecide, proceed: Proceed, refuse: Callable[[Any], None]
    ):
        self._timeline = timeline
        self._redecide = redecide
        self._proceed = proceed
        self._refuse = refuse
        self._queues: dict[str, _RouteQueue] = {}
        self._seq = itertools.count()
        self.served = 0
        self.refused = 0

    def waiting(self, route: str) -> int:
        queue = self._queues.get(route)
        return 0 if queue is None else len(queue.live)

    def enter(self, request: Any, route: CompiledRoute, decision: Decision, deadline: float) -> str | None:
        """Queue ``request`` if waiting could help and the route allows it; else the error it gets."""
        if not worth_waiting(decision):
            return "no_backend_available"
        settings = route.waiting
        queue = self._queues.get(route.name)
        if queue is None:
            queue = self._queues[route.name] = _RouteQueue()
        now = self._timeline.now
        until = min(now + settings.max_wait_s, deadline)
        if until <= now or len(queue.live) >= settings.max_waiting:
            self.refused += 1
            return "backends_busy"
        key = (deadline if settings.order == "deadline" else now, next(self._seq))
        heapq.heappush(queue.heap, key)
        queue.live[key] = request
        self._timeline.schedule(until, self._expire, route.name, key)
        return None

    def notify(self) -> None:
        """Something may have freed: each route's head, then the next, takes what frees."""
        for queue in self._queues.values():
            live = queue.live
            while queue.heap:
                request = live.get(queue.heap[0])
                if request is None:  # gave up while it waited
                    heapq.heappop(queue.heap)
                    continue
                decision = self._redecide(request)
                if not decision.order:
                    break
                del live[heapq.heappop(queue.heap)]
                self.served += 1
                self._proceed(request, decision)

    def _expire(self, route: str, key: Key) -> None:
        queue = self._queues[route]
        request = queue.live.pop(key, None)
        if request is None:
            return  # served before its time was up
        self.refused += 1
        self._refuse(request)
        if len(queue.heap) > 2 * len(queue.live) + 64:  # mostly gone: drop them in one pass
            queue.heap = sorted(queue.live)  # a sorted list is a heap
