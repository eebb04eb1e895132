"""The emulator's HTTP surface: dialect routes, load signals and ``/emulator/`` control routes.

``create_emulator_app`` builds one ``Emulator`` and keeps it on ``app.state``; the handlers stay thin.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.emulator.anthropic_api import messages
from gateway.emulator.arrival import arrive, emulator_of
from gateway.emulator.embeddings import embeddings
from gateway.emulator.exposition import metrics_text, slots_json
from gateway.emulator.faults import Faults, FaultsError
from gateway.emulator.listener import GatedServer
from gateway.emulator.parsing import Endpoint
from gateway.emulator.profiles import Profile, resolve_profile
from gateway.emulator.replies import SERVER_SEND_KEY
from gateway.emulator.serving import Emulator, json_response
from gateway.emulator.switches import health_generation_enabled

PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EmulatorApp(Starlette):
    """Starlette that keeps the server's own ``send`` in the scope, so a reply can cut the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER_SEND_KEY] = send
        await super().__call__(scope, receive, send)


def create_emulator_app(
    profile: str | Profile,
    *,
    time_scale: float = 1.0,
    cold_boot: bool = False,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
    engine_args: tuple[str, ...] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Starlette:
    """``engine_args`` replaces the profile's engine flags; ``environ`` (default: the process's) is read
    for the engine's own switches, as the engine reads them at start."""
    chosen = resolve_profile(profile)
    if engine_args is not None:
        chosen = replace(chosen, engine_args=tuple(engine_args))
    env = os.environ if environ is None else environ
    emulator = Emulator(
        chosen,
        time_scale=time_scale,
        cold_boot=cold_boot,
        seed=seed,
        clock=clock,
        api_key=os.environ.get("EMULATOR_API_KEY") or None,
    )
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/emulator/faults", faults, methods=["GET", "POST", "DELETE"]),
        Route("/emulator/requests", requests_log, methods=["GET", "DELETE"]),
        Route("/emulator/state", state, methods=["GET"]),
    ]
    if chosen.dialect == "llamacpp":
        routes.append(Route("/slots", slots, methods=["GET"]))
    if chosen.dialect == "sglang":
        routes.append(Route("/health_generate", health, methods=["GET"]))
    if chosen.dialect != "anthropic":
        routes.append(Route("/v1/embeddings", embeddings, methods=["POST"]))
    if chosen.dialect == "anthropic":
        routes.append(Route("/v1/messages", messages, methods=["POST"]))
    app = _EmulatorApp(routes=routes)
    app.state.emulator = emulator
    app.state.health_generation = health_generation_enabled(env)
    return app


def run_emulator(
    profile: str,
    *,
    host: str = "127.0.0.1",
    port: int,
    time_scale: float = 1.0,
    cold_boot: bool = False,
    engine_args: tuple[str, ...] | None = None,
) -> None:
    """Serve one emulated upstream until interrupted; vLLM and SGLang do not listen while they load."""
    app = create_emulator_app(profile, time_scale=time_scale, cold_boot=cold_boot, engine_args=engine_args)
    chosen = resolve_profile(profile)
    boot = f", cold boot {chosen.cold_boot_s * time_scale:g}s" if cold_boot and chosen.cold_boot_s else ""
    print(
        f"Emulating {profile} ({chosen.dialect} dialect, model {chosen.model}) on http://{host}:{port}"
        f" at time scale {time_scale:g}{boot}",
        flush=True,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", loop="uvloop", http="httptools")
    GatedServer(config).run()


# -- dialect routes ------------------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    return await _complete(request, "chat")


async def completions(request: Request) -> Response:
    return await _complete(request, "completions")


async def models(request: Request) -> Response:
    emulator = arrive(request)
    refused = emulator.refusal(request)
    if refused is not None:
        return refused
    return json_response(emulator.dialect.models(emulator.profile, int(time.time())))


async def health(request: Request) -> Response:
    emulator = arrive(request)
    enabled = bool(request.app.state.health_generation)
    return await emulator.health(request.url.path, generation_enabled=enabled)


async def metrics(request: Request) -> Response:
    emulator = arrive(request)
    not_yet = _loading(emulator)
    if not_yet is not None:
        return not_yet
    return PlainTextResponse(metrics_text(emulator.engine), media_type=PROMETHEUS_TYPE)


async def slots(request: Request) -> Response:
    emulator = arrive(request)
    not_yet = _loading(emulator)
    if not_yet is not None:
        return not_yet
    return json_response(slots_json(emulator.engine))


# -- control routes (not part of any real dialect) -----------------------------------------------------


async def faults(request: Request) -> Response:
    emulator = emulator_of(request)
    if request.method == "DELETE":
        emulator.set_faults(Faults())
    elif request.method == "POST":
        try:
            emulator.set_faults(emulator.faults.merged(orjson.loads(await request.body())))
        except orjson.JSONDecodeError:
            return json_response({"error": "faults must be a JSON object"}, 400)
        except FaultsError as exc:
            return json_response({"error": str(exc)}, 400)
    return json_response(emulator.faults.model_dump())


async def requests_log(request: Request) -> Response:
    emulator = emulator_of(request)
    if request.method == "DELETE":
        return json_response({"cleared": emulator.requests.clear()})
    return json_response(emulator.requests.entries(request.query_params.get("path")))


async def state(request: Request) -> Response:
    return json_response(emulator_of(request).state())


# -- helpers -------------------------------------------------------------------------------------------


def _loading(emulator: Emulator) -> Response | None:
    """What a load-signal GET gets while booting: no answer (vLLM, SGLang), llama-server's 503."""
    if emulator.refuses_connections():
        return emulator.refusal_cut()
    if emulator.engine.booting and emulator.profile.dialect == "llamacpp":
        return emulator.error_response(503, "Loading model")  # llama.cpp/tools/server/server-http.cpp:307-327
    return None


async def _complete(request: Request, endpoint: Endpoint) -> Response:
    raw = await request.body()
    body: Any = None
    body_error: str | None = None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body_error = f"Invalid JSON body: {exc}"
    emulator = arrive(request, body, raw)
    return await emulator.complete(request, endpoint, body, body_error)
