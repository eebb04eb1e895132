"""A server that dies (the ``dies_for_s`` fault): every request it holds ends at once, its connection cut
with no further byte (no error event, no [DONE]), and for a while nothing answers at all, as when a pool's
machine goes away under its streams. What a gateway meets then is a stream broken off mid-way, which it
can only resume on another backend, and new requests refused, which it can send elsewhere.

Each reply runs in a task of its own (``replies.Reply``); the reply registers that task here while its
parts are produced, and a death cancels every registered task, so a request waiting in the queue, in its
prefill or between two bursts of tokens ends at the moment of death, not at its next frame. No task or
timer per frame: the streams' timing stays what the engine makes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from gateway.emulator.replies import Abort, Part

_DEATH = "emulated server death"  # the cancel message that tells a death from a client leaving


class Death:
    """When the server last died and until when it stays down, in emulated seconds."""

    def __init__(self) -> None:
        self._down_until = float("-inf")
        self._holding: set[asyncio.Task[object]] = set()  # replies' tasks producing parts now

    def die(self, now: float, down_for_s: float) -> None:
        """Cut every request held now; refuse new ones for ``down_for_s`` emulated seconds from ``now``."""
        self._down_until = now + down_for_s
        for task in list(self._holding):
            task.cancel(_DEATH)

    def down(self, now: float) -> bool:
        return now < self._down_until

    def down_left_s(self, now: float) -> float:
        return max(0.0, self._down_until - now)

    async def cuttable(self, parts: AsyncGenerator[Part, None]) -> AsyncGenerator[Part, None]:
        """``parts`` as they come, or an ``Abort`` where the server dies under them."""
        task = asyncio.current_task()
        assert task is not None
        async with contextlib.aclosing(parts):
            while True:
                # Registered only while waiting for the next part: a death never lands in the reply's
                # own sending, where it would leave the connection neither finished nor cut.
                self._holding.add(task)
                try:
                    part = await anext(parts)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError as cancelled:
                    if _DEATH not in cancelled.args:
                        raise  # the client left, or the server stops: not ours to swallow
                    task.uncancel()
                    break
                finally:
                    self._holding.discard(task)
                yield part
        yield Abort()
