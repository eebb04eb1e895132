"""The process-wide bound on completion requests in flight, checked twice: at the door, before the
body is read, so that shedding a flood costs a counter and a short answer; and once the body is in, when
the request takes its place, so that the bound holds strictly for what does hold resources (upstream
connections, reservations, the request's task). Nothing it refuses holds any of them.

A body still arriving holds no place: a client that trickles one (slow-loris) cannot crowd out the
others, and is cut by ``server.body_timeout_s`` instead. Behind this bound each route's ``waiting``
queue bounds who waits for a busy backend; together they keep every queue of the process bounded.
"""

from __future__ import annotations


class InFlight:
    """How many completion requests this process serves right now (streams count until their end)."""

    __slots__ = ("count", "peak", "shed")

    def __init__(self) -> None:
        self.count = 0
        self.peak = 0  # the most at once since start: what an operator sizes ``max_in_flight`` from
        self.shed = 0  # refused since start, at the door or at taking a place

    def has_room(self, limit: int) -> bool:
        """Whether a request arriving now could take a place; False counts it shed."""
        if self.count >= limit:
            self.shed += 1
            return False
        return True

    def enter(self, limit: int) -> bool:
        """Take a place if one of ``limit`` is free; False counts the request shed."""
        if not self.has_room(limit):
            return False
        self.count += 1
        if self.count > self.peak:
            self.peak = self.count
        return True

    def leave(self) -> None:
        self.count -= 1
