"""The gateway's bounded wait queue in virtual time (``runtime/waiting.py``): a request whose candidates
are all full waits, per route in arrival or deadline order, for the first that frees, at most the
route's ``waiting.max_wait_s`` and ``waiting.max_waiting``; past the bound it is refused (429), so
``gateway simulate`` shows back-pressure as the gateway has it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import Any

from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision
from gateway.runtime.waiting import worth_waiting
from gateway.simulate.timeline import Timeline

Redecide = Callable[[Any], Decision]  # the waiting request -> a fresh decision for it
Proceed = Callable[[Any, Decision], None]


class SimWaitingRoom:
    def __init__(
        self, timeline: Timeline, redecide: Redecide, proceed: Proceed, refuse: Callable[[Any], None]
    ):
        self._timeline = timeline
        self._redecide = redecide
        self._proceed = proceed
        self._refuse = refuse
        self._queues: dict[str, list[tuple[tuple[float, int], Any]]] = {}
        self._seq = itertools.count()
        self.served = 0
        self.refused = 0

    def enter(self, request: Any, route: CompiledRoute, decision: Decision, deadline: float) -> str | None:
        """Queue ``request`` if waiting could help and the route allows it; else the error it gets."""
        if not worth_waiting(decision):
            return "no_backend_available"
        settings = route.waiting
        queue = self._queues.setdefault(route.name, [])
        now = self._timeline.now
        until = min(now + settings.max_wait_s, deadline)
        if until <= now or len(queue) >= settings.max_waiting:
            self.refused += 1
            return "backends_busy"
        key = (deadline if settings.order == "deadline" else now, next(self._seq))
        bisect.insort(queue, (key, request), key=lambda entry: entry[0])
        self._timeline.schedule(until, self._expire, route.name, key)
        return None

    def notify(self) -> None:
        """Something may have freed: each route's head, then the next, takes what frees."""
        for queue in self._queues.values():
            while queue:
                decision = self._redecide(queue[0][1])
                if not decision.order:
                    break
                _, request = queue.pop(0)
                self.served += 1
                self._proceed(request, decision)

    def _expire(self, route: str, key: tuple[float, int]) -> None:
        queue = self._queues.get(route, [])
        for i, (waiting_key, request) in enumerate(queue):
            if waiting_key == key:
                del queue[i]
                self.refused += 1
                self._refuse(request)
                return
