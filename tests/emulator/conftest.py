"""Fixtures for the emulator tests: real emulator servers on loopback ports, stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.emulator import GatedServer, create_emulator_app
from tests.servers import ThreadedServer

StartEmulator = Callable[..., ThreadedServer]


@pytest.fixture
def emulator() -> Iterator[StartEmulator]:
    """Start an emulator: ``emulator("b300-vllm", time_scale=0.001)`` returns the running server."""
    started: list[ThreadedServer] = []

    def start(profile: str, **options: Any) -> ThreadedServer:
        # Gated: vLLM and SGLang do not listen while they load, as the real servers.
        server = ThreadedServer(create_emulator_app(profile, **options), server_cls=GatedServer).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
