"""The ``anthropic`` emulator profile's Messages API (POST /v1/messages), for testing backends that speak
it (``dialect: litellm`` with an ``anthropic/...`` model) without the network.

The request is read as the gateway's Messages door reads it, emulated as a chat completion, and written
back with the door's translators, so the wire shapes are the ones the official SDK is tested against.
Errors come in Anthropic's shape (``{"type": "error", "error": {...}}``); the key comes as ``x-api-key``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.doors.anthropic import chat_payload
from gateway.doors.anthropic_message import message_of
from gateway.doors.anthropic_stream import MessagesStream
from gateway.emulator.arrival import arrive
from gateway.emulator.parsing import BadRequest, parse_completion_request
from gateway.emulator.replies import Part, Reply, Start
from gateway.errors import InvalidRequest


async def messages(request: Request) -> Response:
    raw = await request.body()
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    emulator = arrive(request, body, raw)
    if not isinstance(body, dict):
        return emulator.error_response(400, "Request body must be a JSON object.")
    try:
        chat = chat_payload(body)
        if chat["stream"]:
            chat["stream_options"] = {"include_usage": True}
        prompt_tokens = parse_completion_request(chat, "chat", strict_stream_options=True).prompt_tokens
    except (InvalidRequest, BadRequest) as exc:
        return emulator.error_response(400, str(exc))
    reply = await emulator.complete(request, "chat", chat, None)
    if not isinstance(reply, Reply):
        return reply  # an error, already in Anthropic's shape
    model = str(body.get("model"))
    if chat["stream"]:
        return reply.through(lambda parts: _stream(parts, MessagesStream(model, prompt_tokens, "emulated")))
    return reply.through(lambda parts: _whole(parts, model))


async def _stream(
    parts: AsyncGenerator[Part, None], translator: MessagesStream
) -> AsyncGenerator[Part, None]:
    async for part in parts:
        yield translator.translate(part) if isinstance(part, bytes) else part


async def _whole(parts: AsyncGenerator[Part, None], model: str) -> AsyncGenerator[Part, None]:
    start: Start | None = None
    async for part in parts:
        if isinstance(part, Start):
            start = part
        elif isinstance(part, bytes) and start is not None:
            body = orjson.dumps(message_of(orjson.loads(part), model))
            yield Start(start.status, {**start.headers, "content-length": str(len(body))})
            yield body
        else:
            yield part
