"""A request's arrival at the emulator: the ``Emulator`` its app holds, and the request recorded in its
log. Apart from ``app.py`` so the handlers that live beside their dialect (Messages, embeddings) need not
import the app that routes to them."""

from __future__ import annotations

from typing import Any, cast

from starlette.requests import Request

from gateway.emulator.serving import Emulator


def emulator_of(request: Request) -> Emulator:
    return cast(Emulator, request.app.state.emulator)


def arrive(request: Request, body: Any = None, raw: bytes = b"") -> Emulator:
    emulator = emulator_of(request)
    emulator.requests.record(request, body, raw)
    return emulator
