"""What operators watch: the live /dashboard page (static files, no build step), the JSON it polls,
and the Prometheus exposition at /metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from gateway.api.admin import admin_only, runtime_of
from gateway.api.responses import json_response
from gateway.costs import effective_usd_per_mtok
from gateway.errors import error_bytes
from gateway.observation import Observation
from gateway.runtime import Runtime

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
RECENT_SHOWN = 50


async def page(request: Request) -> Response:
    # The page holds no data: it fetches /dashboard/data, with an admin key when the policy has keys.
    return FileResponse(STATIC_DIR / "dashboard.html", headers={"cache-control": "no-cache"})


async def data(request: Request) -> Response:
    return json_response(dashboard_data(runtime_of(request)), headers={"cache-control": "no-store"})


async def metrics(request: Request) -> Response:
    return Response(runtime_of(request).metrics.exposition(), media_type=CONTENT_TYPE_PLAIN_0_0_4)


async def serve_metrics_port(runtime: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """The metrics port: GET /metrics, open to whoever reaches that port; nothing else is there."""
    if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
        response = Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE_PLAIN_0_0_4)
    else:
        body = error_bytes("this port serves only GET /metrics", "not_found_error")
        response = Response(body, status_code=404, media_type="application/json")
    await response(scope, receive, send)


def dashboard_data(runtime: Runtime) -> dict[str, Any]:
    wall = runtime.wall_clock()
    policy = runtime.policy
    times, series = runtime.spend.series(wall)
    return {
        "now": wall,
        "policy": {"source": policy.source, "digest": policy.digest[:12]},
        "routes": _routes(runtime, wall, series),
        "series": {"bucket_s": runtime.spend.bucket_s, "times": times, "routes": series},
        "backends": _backends(runtime),
        "budgets": [
            {
                "scope": use.scope,
                "name": use.name,
                "period": use.period,
                "limit_usd": use.limit_usd,
                "spent_usd": use.spent_usd,
                "reserved_usd": use.reserved_usd,
                "remaining_usd": use.remaining_usd,
            }
            for use in runtime.budgets.usage(policy, wall)
        ],
        "recent": [_recent(runtime, o, wall) for o in list(runtime.recent)[-RECENT_SHOWN:][::-1]],
        "ledger": {"pending_rows": runtime.ledger.pending, "rows_written": runtime.ledger.rows_written},
    }


def _routes(runtime: Runtime, wall: float, series: dict[str, list[float]]) -> list[dict[str, Any]]:
    today = runtime.spend.today(wall)
    names = list(runtime.policy.routes) + sorted(set(today) - set(runtime.policy.routes))
    rows = []
    for name in names:
        usd, requests = today.get(name, (0.0, 0))
        rows.append(
            {
                "route": name,
                "today_usd": usd,
                "today_requests": requests,
                "last_hour_usd": sum(series.get(name, ())),
            }
        )
    return rows


def _backends(runtime: Runtime) -> list[dict[str, Any]]:
    policy = runtime.policy
    rows = []
    for name, view in runtime.stats.snapshot(policy.backends).items():
        backend = policy.backends[name]
        rows.append(
            {
                "backend": name,
                "pricing": backend.price_source,
                "usd_per_mtok_out": effective_usd_per_mtok(backend, view.aggregate_tokens_per_s),
                "ttft_p95_s": view.ttft_p95_s,
                "first_answer_p95_s": view.first_answer_p95_s,
                "decode_tokens_per_s": view.decode_tokens_per_s,
                "aggregate_tokens_per_s": view.aggregate_tokens_per_s,
                "inflight": view.inflight,
                "circuit": view.circuit,
                "healthy": view.healthy and not view.booting,
                "samples": view.samples,
            }
        )
    return rows


def _recent(runtime: Runtime, observation: Observation, wall: float) -> dict[str, Any]:
    final = observation.final
    return {
        "time": wall - (runtime.clock() - observation.started_at),
        "request_id": observation.request_id,
        "route": observation.route,
        "backend": observation.backend,
        "tried": [a.backend for a in observation.attempts],
        "reason": observation.decision_reason,
        "status": observation.status if observation.status == "ok" else observation.error_type,
        "cost_usd": observation.cost_usd,
        "expected_cost_usd": observation.expected_cost_usd,
        "ttft_s": None if final is None else final.ttft_s,
        "api_key": observation.api_key_name,
    }


routes = [
    Route("/dashboard", page, methods=["GET"]),
    Route("/dashboard/data", admin_only(data), methods=["GET"]),
    Mount("/dashboard/static", app=StaticFiles(directory=STATIC_DIR), name="dashboard-static"),
    Route("/metrics", admin_only(metrics), methods=["GET"]),
]
