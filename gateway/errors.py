"""One error tree for the gateway, rendered as OpenAI-format error bodies.

    GatewayError                       (status, OpenAI ``type``, ``code``)
    ├── InternalError                  500 server_error        (a bug: logged, never detailed)
    ├── InvalidRequest                 400 invalid_request_error  (missing or wrong fields)
    │   ├── MalformedBody              400 code=invalid_json (not a JSON object)
    │   ├── BodyTooLarge               413
    │   ├── BodyTimeout                408 code=request_timeout (the body did not arrive in time)
    │   ├── ModelNotFound              404 code=model_not_found (lists the known routes)
    │   └── PolicyRejected             422 code=policy_rejected (a reload's errors, one per line)
    ├── NoRouteAvailable               503 service_unavailable (nothing feasible or healthy)
    ├── Overloaded                     503 code=gateway_overloaded (shed before reading: too many in flight)
    └── UpstreamError                  502 upstream_error      (every attempt failed before a byte was sent)
        └── UpstreamTimeout            504

An error with ``refusal`` set is the gateway turning a request away (its body, credentials or limits:
InvalidRequest and its kind, and the auth, rate-limit and budget errors defined beside what they guard):
the request gets a ledger row with status ``refused``, a log line and a count by reason
(request/refusals.py).

Foreign exceptions (the HTTP client library's, asyncio timeouts) are translated once, in the backend
client, into ``AttemptFailure``; the request path turns the last failure into an ``UpstreamError``.
Messages never carry backend URLs or credentials: they name backends by their policy name only, and
the one text an upstream writes that is passed on (why it refused a request) is ``scrubbed`` first.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    param: str | None = None
    refusal = False  # the gateway turns the request away (the client's to fix), rather than failing it

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
    refusal = True


class MalformedBody(InvalidRequest):
    """The body is empty, not JSON, or JSON but not an object."""

    code = "invalid_json"


class BodyTooLarge(InvalidRequest):
    """Refused when the declared length says so, before the body is read: the connection closes with
    the answer, or the client could go on sending the rest of a 512 MiB body into it."""

    status = 413
    code = "request_too_large"

    def headers(self) -> dict[str, str]:
        return {"connection": "close"}


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
    refusal = False  # an admin's reload, not a request

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
    so it is passed on with the upstream's status instead of being retried elsewhere. Its words are the
    upstream's, so they are scrubbed of what a debug-mode server puts in them (its URL, host, the key it
    was sent, a traceback); a code or param that is not a plain name is dropped."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(scrubbed(message), code=_plain_name(code), param=_plain_name(param))
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


def error_event(message: str, code: str) -> bytes:
    """The error as the SSE event that ends an OpenAI stream (the relay's and the OpenAI doors')."""
    return b"data: " + error_bytes(message, "upstream_error", code) + b"\n\n"


def error_response(exc: GatewayError) -> Response:
    """The error as a whole JSON response, for a door or a handler that answers before any stream."""
    return Response(
        exc.to_bytes(), status_code=exc.status, headers=exc.headers(), media_type="application/json"
    )


# What an upstream's own text may hold that no client of the gateway should read, most specific first.
_HOST_ENDINGS = "com|net|org|io|ai|dev|cloud|internal|local|lan|svc|corp|example|invalid|localdomain"
_TRACEBACK = re.compile(r"Traceback \(most recent call last\).*|\s*File \"[^\"]*\", line \d+.*", re.DOTALL)
_SCRUBBED = (
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE), "[url]"),
    (re.compile(r"\bBearer\s+\S+", re.IGNORECASE), "Bearer [key]"),
    (re.compile(r"\b(?:sk|gwk|key|tok|token|api)[-_][A-Za-z0-9_\-]{6,}", re.IGNORECASE), "[key]"),
    (
        re.compile(r"\b[A-Za-z0-9_]{32,}\b"),
        "[key]",
    ),  # a long opaque token (a key, a digest), not a name-like-this
    (re.compile(r"\[?[0-9a-f:]*:[0-9a-f:]+\]?:\d{2,5}\b|\b[\w.-]+:\d{2,5}\b", re.IGNORECASE), "[host]"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "[host]"),
    # A host name without its port: told from "messages.0.content" by the kind of name it ends in.
    (re.compile(rf"\b(?:[a-z0-9-]+\.)+(?:{_HOST_ENDINGS})\b|\blocalhost\b", re.IGNORECASE), "[host]"),
)
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")
SCRUBBED_MAX_CHARS = 500


def scrubbed(text: str) -> str:
    """An upstream's message with its URLs, host names and addresses, keys and traceback taken out."""
    text = _TRACEBACK.sub("", text)
    for pattern, replacement in _SCRUBBED:
        text = pattern.sub(replacement, text)
    text = text.strip()
    return text if len(text) <= SCRUBBED_MAX_CHARS else text[: SCRUBBED_MAX_CHARS - 3] + "..."


def _plain_name(value: str | None) -> str | None:
    return value if value is not None and _PLAIN_NAME.match(value) and scrubbed(value) == value else None


def scrubbed_error(error: Any) -> dict[str, Any]:
    """An upstream's OpenAI error object as a client may read it: its words scrubbed, its code, type and
    param kept only when they are plain names."""
    if not isinstance(error, dict):
        return {"message": scrubbed(str(error)), "type": "upstream_error", "param": None, "code": None}
    kind = error.get("type")
    return {
        "message": scrubbed(str(error.get("message", ""))),
        "type": _plain_name(kind if isinstance(kind, str) else None) or "upstream_error",
        "param": _plain_name(error.get("param") if isinstance(error.get("param"), str) else None),
        "code": _plain_name(None if error.get("code") is None else str(error.get("code"))),
    }
