"""The OpenAPI 3.1 description of the gateway's endpoints, built from pydantic wire models.

The models describe what each door's parser really accepts (``gateway/doors/*``), so that a schema-driven
fuzzer generates requests the gateway serves as well as ones it must refuse. They are never used to
parse a request: the doors keep their own light checks on the hot path (DESIGN.md s7), and this module is
imported only when someone asks for ``/openapi.json``. Unknown fields are allowed, as the doors pass them
upstream. The ``model`` of every request is an enum of the routes the caller may use, read from the
running policy, so the description is the one of this gateway, not of gateways in general.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.version import gateway_version

Open = ConfigDict(extra="allow")  # the doors forward fields they do not read


class StreamOptions(BaseModel):
    model_config = Open
    include_usage: bool | None = None


class ChatMessage(BaseModel):
    model_config = Open
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(BaseModel):
    """POST /v1/chat/completions."""

    model_config = Open
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    user: str | None = None


class CompletionRequest(BaseModel):
    """POST /v1/completions."""

    model_config = Open
    model: str
    prompt: str | list[str]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None


class TextBlock(BaseModel):
    model_config = Open
    type: Literal["text"]
    text: str


class AnthropicMessage(BaseModel):
    model_config = Open
    role: Literal["user", "assistant", "system"]
    content: str | list[TextBlock]


class AnthropicTool(BaseModel):
    model_config = Open
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class MessagesRequest(BaseModel):
    """POST /v1/messages (Anthropic's Messages API)."""

    model_config = Open
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    tools: list[AnthropicTool] | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens (the gateway's estimate of the prompt's input tokens)."""

    model_config = Open
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None


class InputText(BaseModel):
    model_config = Open
    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(BaseModel):
    model_config = Open
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


class ResponsesRequest(BaseModel):
    """POST /v1/responses (stateless: ``store: true`` and ``previous_response_id`` are refused)."""

    model_config = Open
    model: str
    input: str | list[InputMessage] = Field(min_length=1)
    instructions: str | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    store: Literal[False] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    user: str | None = None


class EmbeddingsRequest(BaseModel):
    """POST /v1/embeddings: text, texts, token ids, or lists of token ids."""

    model_config = Open
    model: str
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None


REQUESTS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/embeddings": EmbeddingsRequest,
}
# Paths some clients use without the /v1 prefix: the same doors.
ALIASES = {
    "/chat/completions": "/v1/chat/completions",
    "/completions": "/v1/completions",
    "/embeddings": "/v1/embeddings",
    "/models": "/v1/models",
    "/models/{model_id}": "/v1/models/{model_id}",
}

# Response bodies: what a client may rely on (the rest is described by the upstream's own API).
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
ANSWERS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "type": "object",
        "required": ["id", "object", "model", "choices"],
        "properties": {"object": {"const": "chat.completion"}, "choices": {"type": "array"}},
    },
    "/v1/completions": {
        "type": "object",
        "required": ["id", "object", "model", "choices"],
        "properties": {"object": {"const": "text_completion"}, "choices": {"type": "array"}},
    },
    "/v1/messages": {
        "type": "object",
        "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
        "properties": {"type": {"const": "message"}, "content": {"type": "array"}},
    },
    "/v1/messages/count_tokens": {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
    },
    "/v1/responses": {
        "type": "object",
        "required": ["id", "object", "model", "output", "status"],
        "properties": {"object": {"const": "response"}, "output": {"type": "array"}},
    },
    "/v1/embeddings": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
    },
}
# One server-sent event as a client's SSE parser sees it (the door's own event names, or none).
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
MODEL = {
    "type": "object",
    "required": ["id", "object", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "owned_by": {"type": "string"}},
}
OBJECT = {"type": "object"}

# Statuses a door can answer besides 200: the client's errors, the key's limits, the upstreams' failures.
DOOR_ERRORS = {
    "400": "invalid request (malformed JSON, a field of the wrong type, stored state asked of /v1/responses)",
    "401": "missing or unknown API key (when the policy has keys)",
    "403": "the key may not use this route",
    "404": "no such route",
    "413": "request body too large",
    "429": "rate limit, budget, or every backend busy past the route's wait (Retry-After says when)",
    "502": "every upstream attempt failed before a byte was sent",
    "503": "no backend available (circuits open, draining)",
    "504": "every upstream attempt timed out",
}
KEY_ERRORS = {"401": "missing or unknown API key", "403": "not an admin key"}


def describe(routes: list[str], keyed: bool) -> dict[str, Any]:
    """The description for a caller who may use ``routes``; ``keyed``: the policy has API keys."""
    schemas: dict[str, Any] = {"Error": ERROR, "AnthropicError": ANTHROPIC_ERROR}
    paths: dict[str, Any] = {}
    for path, model in REQUESTS.items():
        name = model.__name__
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schema["properties"]["model"] = {"type": "string", "enum": routes or ["(no route)"]}
        schemas[name] = schema
        paths[path] = {"post": _door(path, name, keyed)}
    paths["/v1/models"] = {"get": _get("the routes the caller may use", _models_list(), keyed)}
    model_op = _get("one route as a model object", MODEL, keyed, extra={"404": "no such route"})
    model_op["parameters"] = [_param("model_id", "path", required=True)]
    paths["/v1/models/{model_id}"] = {"get": model_op}
    paths["/health"] = {"get": _get("alive, and the version", _health(), False)}
    paths["/ready"] = {
        "get": _get("policy loaded and a backend up", OBJECT, False, extra={"503": "not ready"})
    }
    paths["/openapi.json"] = {"get": _get("this description", OBJECT, keyed)}
    explain = _admin("why a request would go where it goes", keyed, extra={"404": "no such route"})
    explain["parameters"] = [
        _param("model", "query", required=True, schema={"type": "string", "enum": routes or ["(no route)"]}),
        _param("prompt_tokens", "query", schema={"type": "integer", "minimum": 0, "maximum": 999_999_999}),
        _param("max_tokens", "query", schema={"type": "integer", "minimum": 0, "maximum": 999_999_999}),
        _param("cache_key", "query", schema={"type": "string"}),  # a conversation's client key
        _param("key", "query", schema={"type": "string"}),  # whose view of the prefix cache
    ]
    explain["responses"]["400"] = _json_response(
        "a parameter is not a non-negative integer, or no such key", "Error"
    )
    paths["/admin/explain"] = {"get": explain}
    paths["/admin/policy"] = {"get": _admin("the running policy and the last rejected reload", keyed)}
    reload = _admin("reload the policy file", keyed, extra={"422": "the file was rejected"})
    reload["responses"]["400"] = _json_response("this gateway's policy cannot be reloaded", "Error")
    reload["responses"]["413"] = _json_response("a body (it takes none) over the body limit", "Error")
    paths["/admin/policy/reload"] = {"post": reload}
    paths["/admin/backends"] = {"get": _admin("live stats and scraped load signals", keyed)}
    paths["/dashboard"] = {"get": _page("the live dashboard page", "text/html")}
    paths["/dashboard/data"] = {"get": _admin("the JSON the dashboard polls", keyed)}
    static = _page("the dashboard's static files", "*/*")
    static["parameters"] = [_param("path", "path", required=True)]
    static["responses"]["404"] = {"description": "no such file"}
    paths["/dashboard/static/{path}"] = {"get": static}
    metrics = _admin("Prometheus exposition", keyed)
    metrics["responses"]["200"] = {"description": "metrics", "content": {"text/plain": {"schema": {}}}}
    paths["/metrics"] = {"get": metrics}
    for alias, path in ALIASES.items():
        paths[alias] = paths[path]
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "gateway", "version": gateway_version()},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if keyed:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    return document


def _door(path: str, name: str, keyed: bool) -> dict[str, Any]:
    error = "AnthropicError" if path.startswith("/v1/messages") else "Error"
    answer = {"application/json": {"schema": ANSWERS[path]}}
    if path not in ("/v1/embeddings", "/v1/messages/count_tokens"):
        answer["text/event-stream"] = {"schema": SSE_EVENT}
    errors = {k: v for k, v in DOOR_ERRORS.items() if keyed or k not in ("401", "403")}
    operation: dict[str, Any] = {
        "summary": REQUESTS[path].__doc__,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        },
        "responses": {
            "200": {"description": "the answer (an SSE stream when stream is true)", "content": answer},
            **{status: _json_response(text, error) for status, text in errors.items()},
        },
    }
    if keyed:
        operation["security"] = [{"bearer": []}, {"apiKey": []}]
    return operation


def _get(
    summary: str, schema: dict[str, Any], keyed: bool, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    responses = {"200": {"description": summary, "content": {"application/json": {"schema": schema}}}}
    statuses = {**(extra or {}), **({"401": KEY_ERRORS["401"]} if keyed else {})}
    for status, text in statuses.items():
        responses[status] = _json_response(text, "Error")
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    operation["security"] = [{"bearer": []}, {"apiKey": []}] if keyed else []
    return operation


def _admin(summary: str, keyed: bool, extra: dict[str, str] | None = None) -> dict[str, Any]:
    operation = _get(summary, OBJECT, False, extra)
    if keyed:
        for status, text in KEY_ERRORS.items():
            operation["responses"][status] = _json_response(text, "Error")
        operation["security"] = [{"bearer": []}, {"apiKey": []}]
    return operation


def _page(summary: str, media_type: str) -> dict[str, Any]:
    ok = {"description": summary, "content": {media_type: {"schema": {}}}}
    return {"summary": summary, "responses": {"200": ok}, "security": []}


def _json_response(description: str, schema: str) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def _param(
    name: str, where: str, *, required: bool = False, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema or {"type": "string"}}


def _models_list() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
    }


def _health() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["status", "version"],
        "properties": {"status": {"const": "ok"}, "version": {"type": "string"}},
    }
