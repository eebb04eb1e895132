"""ASGI replies for emulated requests: work raced against the client leaving; hangs; aborted connections."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

SERVER_SEND_KEY = "emulator.server_send"  # scope key where the app keeps the server's own send callable


@dataclass(frozen=True, slots=True)
class Start:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class Abort:
    """Part that cuts the TCP connection where it stands, with no further byte."""


Part = Start | bytes | Abort


class Reply(Response):
    """A response made of parts: one ``Start``, then body bytes, or an ``Abort`` at any point.

    An emulated request may hold a seat for a minute before its first byte. When its client goes away the
    seat must come back at once, so the parts run in a task raced against ``http.disconnect``, and the parts
    generator (whose ``finally`` frees the seat) is closed whichever way the reply ends.
    """

    def __init__(self, parts: AsyncGenerator[Part, None]) -> None:
        super().__init__()
        self._parts = parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._pump(scope, send))
        client_left = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({work, client_left}, return_when=asyncio.FIRST_COMPLETED)
            if work.done() and not work.cancelled() and work.result():
                # Aborted: let the server notice the lost connection before we return, so it stays quiet.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(client_left), timeout=1.0)
        finally:
            for task in (work, client_left):
                task.cancel()
            await asyncio.gather(work, client_left, return_exceptions=True)
        failure = work.exception() if work.done() and not work.cancelled() else None
        if failure is not None:
            raise failure

    def through(self, rewrite: Callable[[AsyncGenerator[Part, None]], AsyncGenerator[Part, None]]) -> Reply:
        """The same reply with its parts rewritten (another API's framing of the same answer)."""
        return Reply(rewrite(self._parts))

    async def _pump(self, scope: Scope, send: Send) -> bool:
        """Send the parts; True when the connection was aborted."""
        async with contextlib.aclosing(self._parts) as parts:
            async for part in parts:
                if isinstance(part, Abort):
                    await _abort_connection(scope)
                    return True
                if isinstance(part, Start):
                    headers = [
                        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in part.headers.items()
                    ]
                    await send({"type": "http.response.start", "status": part.status, "headers": headers})
                else:
                    await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return False


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _abort_connection(scope: Scope) -> None:
    """Cut the connection like a crashed server: no final chunk, no [DONE], no status line if none was sent.

    ASGI has no message for this, so we reach the server's transport through its send callable (uvicorn's
    request cycle keeps it as ``transport``). Elsewhere, raising makes the server close the connection.
    """
    server_send = scope.get(SERVER_SEND_KEY)
    transport = getattr(getattr(server_send, "__self__", None), "transport", None)
    if transport is None or not hasattr(transport, "abort"):
        raise ConnectionAbortedError("emulated connection drop")
    transport.abort()
