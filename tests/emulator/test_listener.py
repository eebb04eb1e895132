"""The emulator's gated listener opens its port when loading ends, however the clock falls.

CI once saw `gateway emulate --cold-boot` refuse connections for good: the watcher's timer fired a
hair before the load ended, so the server stayed shut, and by the time the watcher read the clock
again the load was over, so it waited for a reboot that never came. The gate here makes that
crossing certain instead of rare.
"""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.emulator import GatedServer
from tests.servers import ThreadedServer, wait_http


class LoadEndsBetweenReadings:
    """Still loading when the server asks whether to refuse, already loaded when asked how long is left."""

    def __init__(self) -> None:
        self.refusals_left = 2  # start-up's reading, then the reading after the first sleep
        self.loaded = False

    def refuses_connections(self) -> bool:
        refuse = self.refusals_left > 0
        self.refusals_left -= 1
        self.loaded = self.refusals_left <= 0  # the load ends right after this reading
        return refuse

    def loading_left_s(self) -> float:
        return 0.0 if self.loaded else 0.05

    async def reboot(self) -> None:
        await asyncio.Event().wait()  # no reboot comes in this test


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def test_the_port_opens_when_loading_ends_between_two_readings_of_the_clock() -> None:
    app = Starlette(routes=[Route("/health", health)])
    app.state.emulator = LoadEndsBetweenReadings()
    server = ThreadedServer(app, server_cls=GatedServer).start()
    try:
        wait_http(server.url + "/health", timeout=10)
        assert httpx.get(server.url + "/health", timeout=2).text == "ok"
        assert app.state.emulator.refusals_left < 0  # it was asked once more after the load ended
    finally:
        server.stop()
