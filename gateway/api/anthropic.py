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

from gateway.api.bounded import serve_bounded
from gateway.doors.anthropic import MESSAGES, chat_payload
from gateway.doors.openai import json_object, route_of
from gateway.policy.compiled import CompiledPolicy
from gateway.runtime import Runtime
from gateway.store import Ask
from gateway.values.auth import ApiKey, authorize_route
from gateway.values.dialect import estimate_tokens, prompt_chars


async def count_tokens(request: Request) -> Response:
    """Bounded as ``/v1/messages`` is (``api.bounded``): its body could otherwise be of any size."""
    return await serve_bounded(request, MESSAGES, count)


async def count(runtime: Runtime, policy: CompiledPolicy, key: ApiKey | None, raw: bytes) -> Response:
    body = json_object(raw)
    route = route_of(body.get("model"), policy)
    authorize_route(key, route.name)
    limits = runtime.rate_limits
    charges = limits.counting(None if key is None else key.name, policy)
    if charges:
        verdict = await runtime.store.admit(Ask(windows=charges))
        if verdict.status != "ok":
            raise limits.refused(verdict, charges, key.name if key is not None else "")
    # A count has no max_tokens of its own: the translation needs one, and it counts nothing.
    payload = chat_payload({**body, "max_tokens": 1})
    tokens = estimate_tokens(prompt_chars(payload), policy.tuning.chars_per_token)
    headers = {"x-gateway-route": route.name, "x-gateway-token-count": "estimate"}
    return Response(orjson.dumps({"input_tokens": tokens}), headers=headers, media_type="application/json")


routes = [Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
