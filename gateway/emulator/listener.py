"""A uvicorn server that does not listen while its emulated engine loads, as vLLM and SGLang do.

vLLM binds its port before building the engine and calls listen() only when uvicorn starts
(docs/contracts/vllm.yaml, health.refused_while_loading): a client meets a refused connection, not a 503.
``GatedServer`` keeps the port bound and listens only while ``Emulator.refuses_connections()`` is false,
closing the listening socket again when a cold boot (a restart) begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Protocol

import uvicorn


class Gate(Protocol):
    """What the server asks of its app's emulator (``serving.Emulator``)."""

    def refuses_connections(self) -> bool: ...

    def loading_left_s(self) -> float:
        """Real seconds until the weights are loaded; 0 when they are."""
        ...

    async def reboot(self) -> None:
        """Returns when a cold boot (a restart) begins."""
        ...


_RECHECK_S = 0.001  # how soon a refusing server looks again when the load should be over already


class GatedServer(uvicorn.Server):
    """``uvicorn.Server`` for an emulator app: listens on config.host:config.port when the engine lets it."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._gate: asyncio.Task[None] | None = None
        self._bound: socket.socket | None = None
        self._listening: asyncio.base_events.Server | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # no listener of uvicorn's own: the gate opens ours
        if self.should_exit:
            return
        self.servers = []
        emulator = self.config.loaded_app
        while not hasattr(emulator, "state") and hasattr(emulator, "app"):
            emulator = emulator.app  # uvicorn wraps the app (proxy headers, message logger)
        await self._follow(emulator.state.emulator)  # first state now, so `started` means "as it should be"
        self._gate = asyncio.create_task(self._watch(emulator.state.emulator))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._gate is not None:
            self._gate.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gate
        await super().shutdown(sockets)
        if self._bound is not None:
            self._bound.close()

    async def _watch(self, emulator: Gate) -> None:
        # Woken only by a change of state, never on a timer while listening: periodic wake-ups of the
        # loop would tighten the timers of the emulated requests. What to wait for follows from what
        # _follow did, not from a second reading of the clock: a timer that fires a hair early finds
        # the engine still loading, and if the load ended between that reading and another, waiting
        # for a reboot would leave the port refusing for good.
        while True:
            if self._listening is None:
                await asyncio.sleep(max(emulator.loading_left_s(), _RECHECK_S))
            else:
                await emulator.reboot()
            await self._follow(emulator)

    async def _follow(self, emulator: Gate) -> None:
        refuse = emulator.refuses_connections()
        if refuse and self._listening is not None:
            self._listening.close()  # closes the socket: new connections are refused from now on
            self.servers.remove(self._listening)
            self._listening = None
        if self._listening is None and self._bound is None:
            self._bound = _bound_socket(self.config.host, self.config.port)  # the port stays ours meanwhile
        if not refuse and self._listening is None and self._bound is not None:
            self._listening = await asyncio.get_running_loop().create_server(
                self._protocol, sock=self._bound, backlog=self.config.backlog
            )
            self.servers.append(self._listening)
            self._bound = None  # the server owns it now, and closes it when it stops listening

    def _protocol(self) -> Any:
        config = self.config
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
            _loop=asyncio.get_running_loop(),
        )


def _bound_socket(host: str, port: int) -> socket.socket:
    """Bound, not listening: connecting to it is refused (vllm/entrypoints/launchers/launcher.py:340-355)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP (a 0 here left
    # Nagle on every accepted connection: 40 ms per small answer).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock
