"""The doors' bounds for the endpoints beside them that read a body (``/v1/messages/count_tokens``, the
admin POSTs): the same reader (``request.proxy.read_body``: a declared length over the limit refused
before a byte is read, a chunked body cut at the limit, a body that trickles cut by
``server.body_timeout_s``) and, for a client endpoint, the same place among ``server.max_in_flight``
and in the graceful stop's count as a completion request.

Without them one such endpoint undoes the doors' bounds: a body of any size read into memory before its
size is checked, a declared 512 MiB body holding its connection for as long as the client likes, and
requests past the in-flight bound or a stop's grace that nothing counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.doors import Door
from gateway.errors import GatewayError, NoRouteAvailable, Overloaded
from gateway.policy.compiled import CompiledPolicy
from gateway.request.proxy import read_body
from gateway.runtime import Runtime
from gateway.runtime.drain import SHUTDOWN_CODE, UNANSWERED_MESSAGE
from gateway.values.auth import ApiKey


async def bounded_body(policy: CompiledPolicy, request: Request) -> bytes:
    """The request's body through the doors' reader, under ``policy``'s limits."""
    return await read_body(
        request.headers, request.receive, policy.max_body_bytes, policy.server.body_timeout_s
    )


class Held:
    """One request of a bounded endpoint as the graceful stop sees it (the drain's ``Open``): counted
    from its arrival; at the end of the grace its task is cancelled and it is answered 503."""

    __slots__ = ("_task", "stopped")
    response_ended = False  # its answer is one write, made after the work: nothing to end mid-way

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self.stopped = False

    def fail(self, error_type: str) -> None:
        """No row to name the cause in: a count or an admin call is not a billable request."""

    def stop(self) -> None:
        task = self._task
        if not self.stopped and task is not None and not task.done():
            self.stopped = True
            task.cancel()


# What the endpoint does with the body: given the runtime, the request's policy snapshot, its caller's
# key (None where the policy configures none) and the body.
Work = Callable[[Runtime, CompiledPolicy, ApiKey | None, bytes], Awaitable[Response]]


async def serve_bounded(request: Request, door: Door, work: Work) -> Response:
    """``work`` on the request's body, with the doors' bounds: shed past ``server.max_in_flight`` before
    the body is read, the body read by the doors' reader, a place taken once it is in (a body still
    trickling holds none), counted by the graceful stop; every error in ``door``'s format."""
    runtime: Runtime = request.app.state.runtime
    policy = runtime.policy
    server = policy.server
    if not runtime.in_flight.has_room(server.max_in_flight):
        return refused(runtime, door, Overloaded(server.max_in_flight, server.shed_retry_after_s))
    held = Held()
    drain = runtime.drain
    drain.opened(held)
    try:
        key = runtime.authenticate(policy, request.headers)  # as the doors: the caller before its body
        body = await bounded_body(policy, request)
        if not runtime.in_flight.enter(server.max_in_flight):
            raise Overloaded(server.max_in_flight, server.shed_retry_after_s)
        try:
            return await work(runtime, policy, key, body)
        finally:
            runtime.in_flight.leave()
    except GatewayError as exc:
        return refused(runtime, door, exc)
    except ClientDisconnect:  # gone while still sending its body: nobody reads the answer
        return Response(status_code=400)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not held.stopped or task is None:
            raise  # the server's own shutdown, not a graceful stop's end
        task.uncancel()
        return refused(runtime, door, NoRouteAvailable(UNANSWERED_MESSAGE, code=SHUTDOWN_CODE))
    finally:
        drain.closed(held)


def refused(runtime: Runtime, door: Door, error: GatewayError) -> Response:
    runtime.error_returned(error)
    return door.error_response(error)
