"""Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``, with its error type for each
status: what the Messages door answers, and what Starlette's own 404 and 405 become under /v1/messages*.
Apart from the door so the API's exception handlers can use it without importing a door."""

from __future__ import annotations

import orjson

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
               413: "request_too_large", 422: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
PATH_PREFIX = "/v1/messages"  # every path of the Messages API


def error_body(status: int, message: str) -> bytes:
    kind = ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
