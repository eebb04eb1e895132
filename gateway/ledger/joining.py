"""Waiting on the event loop for a thread to end, without a thread the interpreter's exit waits on."""

from __future__ import annotations

import asyncio
import contextlib
import threading


async def joined(thread: threading.Thread, name: str) -> None:
    """Until ``thread`` ends. Joined in a daemon thread of its own, not the loop's executor: a stop that
    gives up on a writer stuck in its database (runtime/stopping.py) must leave no thread the
    interpreter's exit waits on."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ended.done():
            ended.set_result(None)

    def join() -> None:
        thread.join()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(wake)

    threading.Thread(target=join, name=name, daemon=True).start()
    await ended
