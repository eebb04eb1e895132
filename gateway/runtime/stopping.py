"""A stop that always ends: the runtime's close in named stages, each bounded, and a deadline on the
whole process once SIGTERM arrived.

A replica that hangs on SIGTERM is SIGKILLed by the kubelet at ``terminationGracePeriodSeconds``,
and whatever it still held (ledger rows, budget settlements) is lost with it, so nothing here waits
without a bound. The stop's time is budgeted: the drain's ``--grace-s`` (at least ``NOTICE_S`` of
it spent listening, so a load balancer sees /ready fail first), then ``SETTLE_S`` for the streams it
ended, then at most ``CONNECTIONS_WAIT_S`` for connections that still do not close (a client that
does not read), then ``CLOSE_BUDGET_S`` for the stages below, which share it; a stage past its
bound is named with where it waits (its task's stack) and left behind, and the next one runs.
``StopDeadline`` is the backstop: ``STOP_MARGIN_S`` after the grace period it exits the process
itself, whatever still waits (a thread stuck in a database driver cannot be cancelled at all).

Every stage logs when it ended and how long it took, so a slow stop says where its time went.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.runtime.drain import SETTLE_S

log = logging.getLogger("gateway")

CONNECTIONS_WAIT_S = 2  # uvicorn's wait, after the drain, for connections to close by themselves
CLOSE_BUDGET_S = 7.0  # the runtime's close, all stages together
# grace + STOP_MARGIN_S: the process has exited by then, whatever was in flight; one second of slack
# over the parts above. The Kubernetes manifest keeps terminationGracePeriodSeconds (less its preStop
# sleep) at least this far above --grace-s (tests/test_deploy_gateway.py).
STOP_MARGIN_S = SETTLE_S + CONNECTIONS_WAIT_S + CLOSE_BUDGET_S + 1.0
OVERRAN_EXIT_CODE = 70  # EX_SOFTWARE: the stop did not finish by itself; the log says which part hung


@dataclass(frozen=True)
class Stage:
    """One part of the close: ``run`` is called once; it gets at most ``bound_s`` (and what is left of
    the whole close's budget)."""

    name: str
    run: Callable[[], Awaitable[None]]
    bound_s: float
    left_behind: Callable[[], str] | None = None  # what an overrun leaves undone, in words


@dataclass(frozen=True)
class StageOutcome:
    name: str
    seconds: float
    outcome: str  # "done", "failed" (it raised; logged) or "overran" (left behind after its bound)


async def close_in_stages(
    stages: Sequence[Stage], budget_s: float = CLOSE_BUDGET_S, clock: Callable[[], float] = time.monotonic
) -> list[StageOutcome]:
    """Run ``stages`` in order, each within its bound and all within ``budget_s``; never raises.

    A stage runs as a task of its own and is waited for with ``asyncio.wait``, which returns at the
    bound even if the stage ignores its cancellation (``asyncio.wait_for`` would wait for it)."""
    began = clock()
    outcomes = []
    for stage in stages:
        left = max(0.0, budget_s - (clock() - began))
        bound = min(stage.bound_s, left)
        started = clock()
        task = asyncio.ensure_future(stage.run())
        done, _ = await asyncio.wait({task}, timeout=bound)
        seconds = clock() - started
        if not done:
            lost = "" if stage.left_behind is None else f" ({stage.left_behind()})"
            log.error(
                "stop: %s still running after %.1f s (its bound); going on without it%s. It waits in:\n%s",
                stage.name,
                bound,
                lost,
                where_it_waits(task),
            )
            task.cancel()  # not awaited: a stage that swallows its cancellation must not hold the stop
            outcomes.append(StageOutcome(stage.name, seconds, "overran"))
            continue
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("stop: %s failed after %.2f s: %r", stage.name, seconds, error, exc_info=error)
            outcomes.append(StageOutcome(stage.name, seconds, "failed"))
        else:
            log.info("stop: %s done in %.2f s", stage.name, seconds)
            outcomes.append(StageOutcome(stage.name, seconds, "done"))
    log.info("stop: closed in %.2f s", clock() - began)
    return outcomes


async def cancel_tasks(tasks: Sequence[asyncio.Task[Any]], bound_s: float) -> None:
    """Cancel the runtime's background loops and wait up to ``bound_s`` for them to end; a loop that
    swallowed its cancellation (Python 3.11's ``wait_for`` can, when its inner wait ends at the same
    moment) is named with its stack and left behind instead of holding the stop for ever."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=bound_s)
    for task in pending:
        log.error("stop: background task %s ignored its cancellation; left behind in:\n%s",
                  task.get_name(), where_it_waits(task))  # fmt: skip


def where_it_waits(task: asyncio.Task[Any]) -> str:
    frames = task.get_stack()
    if not frames:
        return "  (no frame: the task waits on a future that is not a coroutine's)"
    return "\n".join(
        f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" for frame in frames
    )


class StopDeadline:
    """The backstop: armed at SIGTERM, it ends the process ``grace_s + STOP_MARGIN_S`` later if it has
    not ended by itself, after writing every thread's stack to stderr (what hung). A daemon thread, so
    it never keeps a finished process alive; it runs ``os._exit`` because by then the interpreter's
    own exit may be what waits (a worker thread stuck in a join)."""

    def __init__(self, grace_s: float, margin_s: float = STOP_MARGIN_S) -> None:
        self.seconds = grace_s + margin_s
        self._margin_s = margin_s
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.seconds, self._overran)
        self._timer.daemon = True
        self._timer.name = "stop-deadline"
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _overran(self) -> None:
        log.critical(
            "stop: still running %.1f s after SIGTERM (grace + %.0f s margin): exiting now; every "
            "thread's stack follows",
            self.seconds,
            self._margin_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(OVERRAN_EXIT_CODE)
