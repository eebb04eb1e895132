"""Thin handlers for the client-facing API: the doors' paths (chat, completions, embeddings, Anthropic
messages, responses), /v1/models, and /openapi.json, the description of them all."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.api.admin import runtime_of
from gateway.api.responses import json_response
from gateway.doors import Door
from gateway.doors.anthropic import MESSAGES
from gateway.doors.embeddings import EMBEDDINGS
from gateway.doors.openai import CHAT, COMPLETIONS
from gateway.doors.responses import RESPONSES
from gateway.errors import ModelNotFound
from gateway.request.proxy import serve

# The paths ``GatewayApp`` serves without Starlette's router (the Routes below stay for the rest).
HOT_PATHS: dict[str, Door] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/chat/completions": CHAT,
    "/completions": COMPLETIONS,
    "/v1/messages": MESSAGES,
    "/v1/responses": RESPONSES,
    "/v1/embeddings": EMBEDDINGS,
    "/embeddings": EMBEDDINGS,
}


class DoorEndpoint:
    """The same request path as an ASGI endpoint of Starlette's router (which only sees the requests
    that ``GatewayApp`` did not take first)."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope["app"].state.runtime, self.door, scope, receive, send)


async def models(request: Request) -> Response:
    runtime = runtime_of(request)
    policy = runtime.policy
    key = runtime.authenticate(policy, request.headers)
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "gateway", "description": route.description}
        for name, route in policy.routes.items()
        if key is None or key.may_use(name)
    ]
    return json_response({"object": "list", "data": data})


async def model(request: Request) -> Response:
    """One route as a model object; 404 in OpenAI's shape for a name the caller cannot use."""
    runtime = runtime_of(request)
    policy = runtime.policy
    key = runtime.authenticate(policy, request.headers)
    name = request.path_params["model_id"]
    route = policy.routes.get(name)
    if route is None or (key is not None and not key.may_use(name)):
        raise ModelNotFound(f"The model '{name[:200]}' does not exist")
    return json_response(
        {"id": name, "object": "model", "created": 0, "owned_by": "gateway", "description": route.description}
    )


async def openapi(request: Request) -> Response:
    """Authenticated like /v1/models, since it names routes, and naming only the caller's. The description
    module (pydantic models) is imported on the first request for it: start-up does not pay for it."""
    from gateway.api.description import describe

    runtime = runtime_of(request)
    policy = runtime.policy
    key = runtime.authenticate(policy, request.headers)
    names = [name for name in policy.routes if key is None or key.may_use(name)]
    return json_response(describe(names, keyed=bool(policy.api_keys)))


routes = [
    Route("/v1/chat/completions", DoorEndpoint(CHAT), methods=["POST"]),
    Route("/v1/completions", DoorEndpoint(COMPLETIONS), methods=["POST"]),
    Route("/v1/messages", DoorEndpoint(MESSAGES), methods=["POST"]),
    Route("/v1/responses", DoorEndpoint(RESPONSES), methods=["POST"]),
    Route("/v1/embeddings", DoorEndpoint(EMBEDDINGS), methods=["POST"]),
    Route("/embeddings", DoorEndpoint(EMBEDDINGS), methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", model, methods=["GET"]),
    # Some clients are configured without the /v1 prefix.
    Route("/chat/completions", DoorEndpoint(CHAT), methods=["POST"]),
    Route("/completions", DoorEndpoint(COMPLETIONS), methods=["POST"]),
    Route("/models", models, methods=["GET"]),
    Route("/models/{model_id:path}", model, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]
