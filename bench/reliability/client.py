"""One client request against a gateway, and what the client saw of it, in the terms the table counts:
a whole answer, a stream that ended with an error event after its first bytes, a refusal (an HTTP error
status), or a connection cut before any answer."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import httpx
import orjson

OK = "ok"
ERROR_EVENT = "error event"  # a stream that began, then ended with an SSE error event (never [DONE])
CUT_MID_STREAM = "cut mid-stream"  # a stream that began, then stopped with neither [DONE] nor an error
REFUSED = "refused"  # an HTTP error status: nothing of an answer was sent
LOST = "lost"  # no answer at all: the connection failed or was cut before a status line
BAD_ANSWER = "bad answer"  # a 200 that is not an answer (no choices, corrupt JSON)


@dataclass
class Outcome:
    kind: str
    status: int | None = None
    backend: str | None = None  # x-gateway-backend
    code: str | None = None  # the OpenAI error code of a refusal or an error event
    detail: str = ""

    @property
    def began(self) -> bool:
        """Whether bytes of an answer reached the client (a failure then is mid-stream)."""
        return self.kind in (OK, ERROR_EVENT, CUT_MID_STREAM)


def payload(route: str, stream: bool, max_tokens: int = 16) -> dict[str, object]:
    body: dict[str, object] = {
        "model": route,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": max_tokens,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def ask(client: httpx.AsyncClient, base_url: str, route: str, stream: bool) -> Outcome:
    try:
        async with client.stream(
            "POST", base_url + "/v1/chat/completions", json=payload(route, stream)
        ) as response:
            backend, body = response.headers.get("x-gateway-backend"), b""
            try:
                async for chunk in response.aiter_bytes():
                    body += chunk
            except httpx.HTTPError as exc:
                return Outcome(CUT_MID_STREAM, response.status_code, backend, detail=repr(exc))
            return judge(response.status_code, backend, stream, body)
    except httpx.HTTPError as exc:
        return Outcome(LOST, detail=repr(exc))


def judge(status: int, backend: str | None, stream: bool, body: bytes) -> Outcome:
    if status != 200:
        return Outcome(REFUSED, status, backend, error_code(body), body[:200].decode(errors="replace"))
    if stream:
        events = [e for e in body.split(b"\n\n") if e.strip()]
        if events and events[-1].strip() == b"data: [DONE]" and b'"error"' not in body:
            return Outcome(OK, status, backend)
        if events and events[-1].startswith(b"data: {") and b'"error"' in events[-1]:
            return Outcome(ERROR_EVENT, status, backend, error_code(events[-1][6:]))
        return Outcome(CUT_MID_STREAM, status, backend, detail=body[-200:].decode(errors="replace"))
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Outcome(BAD_ANSWER, status, backend, detail=body[:200].decode(errors="replace"))
    if not isinstance(answer, dict) or not answer.get("choices") or "error" in answer:
        return Outcome(BAD_ANSWER, status, backend, detail=body[:200].decode(errors="replace"))
    return Outcome(OK, status, backend)


def error_code(body: bytes) -> str | None:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    return dict(Counter(o.kind for o in outcomes))


def new_client(timeout_s: float = 120.0) -> httpx.AsyncClient:
    """A fresh connection per request (no keep-alive), as a load balancer's clients spread out; the
    timeout only bounds a hang."""
    return httpx.AsyncClient(
        timeout=timeout_s, limits=httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    )
