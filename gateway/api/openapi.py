"""GET /openapi.json: the description of this gateway's endpoints, for the caller who asks.

Authenticated like /v1/models (it names the routes), and listing only the routes the caller's key may
use. The description module (pydantic models) is imported on the first request for it, so the
gateway's start-up does not pay for it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.admin import runtime_of
from gateway.api.responses import json_response


async def openapi(request: Request) -> Response:
    from gateway.api.description import describe

    runtime = runtime_of(request)
    policy = runtime.policy
    key = runtime.authenticate(policy, request.headers)
    routes = [name for name in policy.routes if key is None or key.may_use(name)]
    return json_response(describe(routes, keyed=bool(policy.api_keys)))


routes = [Route("/openapi.json", openapi, methods=["GET"])]
