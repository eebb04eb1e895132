"""create_app(): the ASGI application; its lifespan builds and closes the one Runtime.

Starlette rather than FastAPI: the same ASGI stack without per-request dependency injection and
validation, which measured ~30% more proxied requests/s (DESIGN.md s7). The two completion endpoints,
which carry nearly every request and every streamed chunk, skip even Starlette's router and its two
exception middlewares (each wraps every ``send``): ``GatewayApp`` hands them to the request path directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from gateway.api import admin, anthropic, dashboard, openai
from gateway.api.responses import exception_handlers
from gateway.process import tune_for_serving
from gateway.request.proxy import serve
from gateway.runtime import Runtime


class GatewayApp:
    """POSTs to the completion endpoints go straight to the request path; the rest to Starlette.

    With a ``metrics_port`` the same process also listens there, and that port serves only
    ``GET /metrics``, without a key: for scrapers on a network the API port is not exposed to.
    """

    def __init__(self, app: Starlette, metrics_port: int | None = None) -> None:
        self.app = app
        self.metrics_port = metrics_port

    @property
    def state(self) -> State:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.metrics_port is not None and scope["type"] == "http":
            server = scope.get("server")
            if server is not None and server[1] == self.metrics_port:
                await dashboard.serve_metrics_port(self.app.state.runtime, scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "POST":
            door = openai.HOT_PATHS.get(scope["path"])
            if door is not None:
                await serve(self.app.state.runtime, door, scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    build_runtime: Callable[[], Runtime], *, metrics_port: int | None = None, serving_process: bool = False
) -> GatewayApp:
    """``build_runtime`` runs inside the server's event loop, at start-up, exactly once. A
    ``serving_process`` (``gateway serve``, each of its workers) owns its process: once started, it
    tunes the interpreter for serving (``gateway.process``)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime = build_runtime()
        app.state.runtime = runtime
        await runtime.start()
        if serving_process:
            tune_for_serving()
        try:
            yield
        finally:
            await runtime.close()

    return GatewayApp(
        Starlette(
            routes=[*openai.routes, *anthropic.routes, *admin.routes, *dashboard.routes],
            exception_handlers=exception_handlers,
            lifespan=lifespan,
        ),
        metrics_port,
    )
