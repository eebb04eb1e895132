"""A loopback relay between a real client and the gateway that writes down every exchange (method,
path, status, the JSON body sent), so a test can say "every request was answered 2xx" for requests
the gateway may not count (a path it does not serve, say). It passes bodies on unchanged; a stream
reaches the client whole once it has ended, which changes only its pace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# Headers that describe one hop, not the message.
HOP_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive"})


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    body: Any  # the request's JSON (None when it had none)


@dataclass
class Relay:
    target: str  # the gateway's URL
    exchanges: list[Exchange] = field(default_factory=list)

    def app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            raw = await request.body()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
            url = self.target + request.url.path + (f"?{request.url.query}" if request.url.query else "")
            async with httpx.AsyncClient(timeout=120) as client:
                answer = await client.request(request.method, url, content=raw, headers=headers)
            body = orjson.loads(raw) if raw.startswith(b"{") else None
            self.exchanges.append(Exchange(request.method, request.url.path, answer.status_code, body))
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in HOP_HEADERS and k.lower() != "content-encoding"
            }
            return Response(answer.content, status_code=answer.status_code, headers=kept)

        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])

    def messages(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == "/v1/messages" and e.method == "POST"]
