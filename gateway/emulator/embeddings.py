"""The emulators' embedding model (POST /v1/embeddings, OpenAI's shape): a deterministic unit vector per
input, as floats or as base64 float32 (the openai SDK asks for base64), with prompt-token usage."""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.emulator.arrival import arrive
from gateway.emulator.prefix_cache import CHARS_PER_TOKEN

DIMENSIONS = 16


def vector(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def texts_of(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return [" ".join(map(str, value))]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return [" ".join(map(str, v)) for v in value]
    return None


async def embeddings(request: Request) -> Response:
    raw = await request.body()
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    emulator = arrive(request, body, raw)
    refused = emulator.refusal(request)
    if refused is not None:
        return refused
    texts = texts_of(body.get("input")) if isinstance(body, dict) else None
    if texts is None:
        return emulator.error_response(400, "'input' must be a string, strings or token ids.")
    faults = emulator.faults
    if faults.error_rate > 0 and emulator.rng.random() < faults.error_rate:
        return emulator.error_response(faults.error_status, "Injected fault (error_rate).")
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        values = vector(text, int(body.get("dimensions") or DIMENSIONS))
        encoded: Any = (
            base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode() if as_base64 else values
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts)
    answer = {"object": "list", "data": data, "model": body.get("model") or emulator.profile.model,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
    return Response(orjson.dumps(answer), media_type="application/json")
