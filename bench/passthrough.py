"""The in-Python limit: a bare pass-through proxy (Starlette route + aiohttp client on uvicorn, uvloop,
httptools), with nothing a gateway does (no routing, measuring, ledger). ``bench.run`` reports the gateway
as a share of it. Usage: python -m bench.passthrough --port 18003 --upstream http://127.0.0.1:18001"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    session: dict[str, aiohttp.ClientSession] = {}

    async def chat(request: Request) -> Response:
        body = await request.body()
        headers = {
            "content-type": "application/json",
            "authorization": request.headers.get("authorization", ""),
        }
        answer = await session["s"].post(upstream + "/v1/chat/completions", data=body, headers=headers)
        if not answer.content_type.startswith("text/event-stream"):
            return Response(await answer.read(), answer.status, media_type=answer.content_type)

        async def relay() -> AsyncIterator[bytes]:
            async with answer:
                async for chunk in answer.content.iter_any():
                    yield chunk

        return StreamingResponse(relay(), answer.status, media_type="text/event-stream")

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await session["s"].close()

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL of the upstream, without /v1")
    args = parser.parse_args()
    app = create_app(args.upstream)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", access_log=False)


if __name__ == "__main__":
    main()
