"""The embeddings door, POST /v1/embeddings: OpenAI's own shape, so the request goes upstream with only
the model replaced and the answer comes back untouched; its input tokens are what gets priced."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from gateway.doors import ClientRequest
from gateway.doors.openai import json_object, route_of
from gateway.errors import GatewayError, InvalidRequest, error_response
from gateway.policy.compiled import CompiledPolicy
from gateway.values.dialect import estimate_tokens

if TYPE_CHECKING:
    from gateway.doors import Answering, StreamTranslator

TOKEN_IDS_CHARS = 4  # a token id given instead of text stands for about one token's characters


class EmbeddingsDoor:
    name = "embeddings"
    upstream_path = "/embeddings"

    def parse(
        self, body: bytes, policy: CompiledPolicy, chars_per_token: float, caller: str = ""
    ) -> ClientRequest:

        payload = json_object(body)
        route = route_of(payload.get("model"), policy)
        if payload.get("stream"):
            raise InvalidRequest("embeddings are not streamed; leave 'stream' out", param="stream")
        chars = input_chars(payload.get("input"))
        return ClientRequest(
            payload=payload,
            route=route,
            stream=False,
            wants_usage=False,
            prompt_chars=chars,
            prompt_tokens=estimate_tokens(chars, chars_per_token),
            max_tokens=1,  # nothing is generated: the decision prices the input alone
        )

    def render_answer(self, raw: bytes, exchange: Answering) -> bytes:
        return raw

    def stream_translator(self, exchange: Answering) -> StreamTranslator | None:
        return None

    def error_response(self, error: GatewayError) -> Response:
        return error_response(error)


def input_chars(value: Any) -> int:
    """Characters in ``input``: a string, strings, token ids, or lists of token ids; 400 otherwise."""
    if isinstance(value, str) and value:
        return len(value)
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return sum(len(item) for item in value)
        if all(type(item) is int for item in value):
            return len(value) * TOKEN_IDS_CHARS
        if all(isinstance(item, list) and all(type(t) is int for t in item) for item in value):
            return sum(len(item) for item in value) * TOKEN_IDS_CHARS
    raise InvalidRequest(
        "'input' is required: a non-empty string, array of strings, or array of token ids", param="input"
    )


EMBEDDINGS = EmbeddingsDoor()
