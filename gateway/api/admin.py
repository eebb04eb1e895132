"""Operational endpoints: /health (the process is alive), /ready (it can serve), /admin/*."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.responses import json_response
from gateway.runtime import Runtime


async def health(request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    report = await runtime.readiness()
    return json_response(report, status=200 if report["ready"] else 503)


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
]
