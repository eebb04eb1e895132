"""JSON responses and the exception handlers that turn every error into an OpenAI-format body (an
Anthropic one under /v1/messages*)."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.doors import anthropic_errors
from gateway.errors import GatewayError, error_bytes, error_response
from gateway.log_text import log_text

log = logging.getLogger("gateway")

# OpenAI's error types for the statuses Starlette itself may raise (unknown path, wrong method).
_HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers, media_type="application/json")


def internal_error_response() -> Response:
    body = error_bytes("the gateway hit an internal error; it has been logged", "server_error")
    return Response(body, status_code=500, media_type="application/json")


async def gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.error_returned(exc)
    return error_response(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    if request.url.path.startswith(anthropic_errors.PATH_PREFIX):  # Anthropic's SDKs read their own shape
        body = anthropic_errors.error_body(exc.status_code, message)
    else:
        body = error_bytes(message, _HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error"))
    return Response(body, status_code=exc.status_code, headers=exc.headers, media_type="application/json")


async def unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, log_text(request.url.path))
    return internal_error_response()


exception_handlers = {GatewayError: gateway_error, HTTPException: http_error, Exception: unexpected_error}
