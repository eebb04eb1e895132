"""One error tree for the gateway, rendered as OpenAI-format error bodies.

    GatewayError                       (status, OpenAI ``type``, ``code``)
    ├── InternalError                  500 server_error        (a bug: logged, never detailed)
    ├── InvalidRequest                 400 invalid_request_error  (malformed JSON, missing fields)
    │   ├── BodyTooLarge               413
    │   ├── BodyTimeout                408 code=request_timeout (the body did not arrive in time)
    │   ├── ModelNotFound              404 code=model_not_found (lists the known routes)
    │   └── PolicyRejected             422 code=policy_rejected (a reload's errors, one per line)
    ├── NoRouteAvailable               503 service_unavailable (nothing feasible or healthy)
    ├── Overloaded                     503 code=gateway_overloaded (shed before reading: too many in flight)
    └── UpstreamError                  502 upstream_error      (every attempt failed before a byte was sent)
        └── UpstreamTimeout            504

Foreign exceptions (the HTTP client library's, asyncio timeouts) are translated once, in the backend
client, into ``AttemptFailure``; the request path turns the last failure into an ``UpstreamError``.
Messages never carry backend URLs or credentials: they name backends by their policy name only.
"""

from __future__ import annotations

import math
from typing import Any

import orjson


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def headers(self) -> dict[str, str]:
        return {}


class InternalError(GatewayError):
    """A bug of ours: logged where it happened; the client learns only that it happened."""

    code = "internal_error"

    def __init__(self) -> None:
        super().__init__("the gateway hit an internal error; it has been logged")


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class BodyTimeout(InvalidRequest):
    """The body trickled in slower than ``server.body_timeout_s`` allows: the connection is closed
    with the answer, since the rest of the body may still be on its way."""

    status = 408
    code = "request_timeout"

    def headers(self) -> dict[str, str]:
        return {"connection": "close"}


class ModelNotFound(InvalidRequest):
    status = 404
    code = "model_not_found"
    param = "model"


class PolicyRejected(InvalidRequest):
    """``POST /admin/policy/reload`` found an invalid file: the errors, and the policy still serving."""

    status = 422
    code = "policy_rejected"

    def __init__(self, message: str, errors: list[str]) -> None:
        super().__init__(message)
        self.errors = errors

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["errors"] = self.errors
        return body


class NoRouteAvailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_backend_available"


class Overloaded(GatewayError):
    """The process already serves ``server.max_in_flight`` requests: refused before its body is read,
    so that a flood costs the gateway almost nothing and the requests it took keep their latency."""

    status = 503
    type = "service_unavailable"
    code = "gateway_overloaded"

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"the gateway is serving its limit of {limit} requests; retry after {retry_after_s}s"
        )
        self.retry_after = str(retry_after_s)

    def headers(self) -> dict[str, str]:
        # The connection closes too: a shed request's body may be unread, and a client could otherwise
        # keep trickling it for ever; and fewer kept-alive connections is what an overloaded server wants.
        return {"retry-after": self.retry_after, "connection": "close"}


class BackendsBusy(GatewayError):
    """Every candidate stayed full or rate-limited for as long as the route lets a request wait:
    backpressure, so the client is told when to come back instead of being failed."""

    status = 429
    type = "rate_limit_error"
    code = "backends_busy"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after = str(max(1, math.ceil(retry_after_s)))

    def headers(self) -> dict[str, str]:
        return {"retry-after": self.retry_after}


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_failed"

    def __init__(self, message: str, *, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"retry-after": self.retry_after} if self.retry_after else {}


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamClientError(GatewayError):
    """The upstream refused the request itself (bad parameters, context too long): the client's to fix,
    so it is passed on with the upstream's status instead of being retried elsewhere."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, code=code, param=param)
        self.status = status


class AttemptFailure(Exception):
    """One upstream attempt failed; ``kind`` decides whether another backend may be tried."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: str | None = None,
        client_fault: GatewayError | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind  # "connect_error" | "timeout" | "upstream_error" | "dropped"
        self.message = message
        self.http_status = http_status
        self.retry_after = retry_after
        self.client_fault = client_fault  # set when the request itself was refused (do not retry)


def error_bytes(status_message: str, type_: str = "server_error", code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": status_message, "type": type_, "param": None, "code": code}})
