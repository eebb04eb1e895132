"""The Messages API's other path, ``POST /v1/messages/count_tokens``. (Its errors, like Starlette's 404
and 405 anywhere under /v1/messages*, come in Anthropic's shape: ``doors.anthropic_errors``.)

Tokens are counted as the gateway estimates a prompt before sending it: the characters of the chat
payload the door would send upstream, over ``tuning.chars_per_token``. No backend here exposes the
tokenizer of the model behind a route to the gateway, so this is an estimate (docs/agents.md).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.admin import runtime_of
from gateway.doors.anthropic import MESSAGES, chat_payload
from gateway.doors.openai import json_object, route_of
from gateway.errors import BodyTooLarge, GatewayError
from gateway.values.auth import authorize_route
from gateway.values.dialect import estimate_tokens, prompt_chars


async def count_tokens(request: Request) -> Response:
    runtime = runtime_of(request)
    policy = runtime.policy
    try:
        key = runtime.authenticate(policy, request.headers)
        raw = await request.body()
        if len(raw) > policy.max_body_bytes:
            raise BodyTooLarge(f"request body exceeds the limit of {policy.max_body_bytes} bytes")
        body = json_object(raw)
        route = route_of(body.get("model"), policy)
        authorize_route(key, route.name)
        # A count has no max_tokens of its own: the translation needs one, and it counts nothing.
        payload = chat_payload({**body, "max_tokens": 1})
        tokens = estimate_tokens(prompt_chars(payload), policy.tuning.chars_per_token)
    except GatewayError as exc:
        runtime.error_returned(exc)
        return MESSAGES.error_response(exc)
    headers = {"x-gateway-route": route.name, "x-gateway-token-count": "estimate"}
    return Response(orjson.dumps({"input_tokens": tokens}), headers=headers, media_type="application/json")


routes = [Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
