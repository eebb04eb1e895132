"""The process-wide bound on completion requests in flight: the first gate a request meets, before its
body is read, so that shedding a flood costs a counter and a short answer, and nothing it refuses holds a
reservation, a task of its own or an upstream connection.

Behind it, each route's ``waiting`` queue bounds who waits for a busy backend; together they keep every
queue of the process bounded, and with them its memory.
"""

from __future__ import annotations


class InFlight:
    """How many completion requests this process serves right now (streams count until their end)."""

    __slots__ = ("count", "peak", "shed")

    def __init__(self) -> None:
        self.count = 0
        self.peak = 0  # the most at once since start: what an operator sizes ``max_in_flight`` from
        self.shed = 0  # refused at the gate since start

    def enter(self, limit: int) -> bool:
        """Take a place if one of ``limit`` is free; False means the request is to be shed."""
        if self.count >= limit:
            self.shed += 1
            return False
        self.count += 1
        if self.count > self.peak:
            self.peak = self.count
        return True

    def leave(self) -> None:
        self.count -= 1
