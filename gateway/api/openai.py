"""Thin handlers for the OpenAI-compatible surface: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.api.admin import runtime_of
from gateway.api.responses import error_response, internal_error_response, json_response, log
from gateway.errors import GatewayError
from gateway.proxy import Endpoint, complete
from gateway.runtime import Runtime
from gateway.streaming import StreamRelay

# The paths ``GatewayApp`` serves without Starlette's router (the Routes below stay for the rest).
HOT_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/chat/completions": "chat",
    "/completions": "completions",
}


async def serve_completion(
    runtime: Runtime, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send
) -> None:
    """One completion request as a bare ASGI call; errors become OpenAI-format bodies here, as the
    exception handlers do for routed requests."""
    try:
        response: Response | StreamRelay = await complete(runtime, Request(scope, receive), endpoint)
    except GatewayError as exc:
        runtime.error_returned(exc)
        response = error_response(exc)
    except Exception:
        log.exception("unhandled error on POST %s", scope["path"])
        response = internal_error_response()
    await response(scope, receive, send)


async def chat_completions(request: Request) -> Response | StreamRelay:
    return await complete(runtime_of(request), request, "chat")


async def completions(request: Request) -> Response | StreamRelay:
    return await complete(runtime_of(request), request, "completions")


async def models(request: Request) -> Response:
    policy = runtime_of(request).policy
    key = runtime_of(request).authenticate(request.headers)
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "gateway", "description": route.description}
        for name, route in policy.routes.items()
        if key is None or key.may_use(name)
    ]
    return json_response({"object": "list", "data": data})


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    # Some clients are configured without the /v1 prefix.
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/completions", completions, methods=["POST"]),
    Route("/models", models, methods=["GET"]),
]
