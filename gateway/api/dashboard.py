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
from gateway.errors import error_bytes
from gateway.measure.demand import idle_usd_per_hour, pools_of
from gateway.metrics.ledger_view import LedgerSnapshot
from gateway.money.costs import SECONDS_PER_HOUR, effective_usd_per_mtok
from gateway.policy.compiled import CompiledPolicy
from gateway.runtime import Runtime
from gateway.values.observation import Observation

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
RECENT_SHOWN = 50


async def page(request: Request) -> Response:
    # The page holds no data: it fetches /dashboard/data, with an admin key when the policy has keys.
    return FileResponse(STATIC_DIR / "dashboard.html", headers={"cache-control": "no-cache"})


async def data(request: Request) -> Response:
    runtime = runtime_of(request)
    view = await runtime.ledger_view.current()
    return json_response(dashboard_data(runtime, view), headers={"cache-control": "no-store"})


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


def dashboard_data(runtime: Runtime, view: LedgerSnapshot) -> dict[str, Any]:
    wall = runtime.wall_clock()
    policy = runtime.policy
    ledger = runtime.ledger
    shared = ledger.database.shared
    # A shared ledger shows the fleet (as of the view's last read); a file of our own, this process
    # live, counted as each request ends.
    tally = view.tally if shared and view.tally is not None else runtime.spend
    times, series = tally.series(wall)
    return {
        "now": wall,
        "replica": runtime.replica,
        "policy": {"source": policy.source, "digest": policy.digest[:12]},
        "routes": _routes(runtime, tally.today(wall), view, series),
        "series": {"bucket_s": tally.bucket_s, "times": times, "routes": series},
        "pools": pool_rows(policy, view),
        # As the ledger has them at the view's last read (a few seconds behind, like the pools).
        "refused": [{"reason": reason, "requests": count} for reason, count in view.refusals],
        "capacity": capacity_rows(runtime),
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
        "replicas": [
            {"replica": t.key, "today_usd": t.cost_usd, "today_requests": t.requests, "errors": t.errors}
            for t in view.replicas
        ]
        if shared
        else [],
        "recent": _fleet_recent(view) if shared else _local_recent(runtime, wall),
        "degraded": degraded(runtime),
        "store": runtime.store.report(),
        "ledger": {
            "location": ledger.location,
            "shared": shared,
            "up": ledger.up,
            "pending_rows": ledger.pending,
            "rows_written": ledger.rows_written,
            "read_at": view.read_at,
            "error": view.error,
        },
    }


def degraded(runtime: Runtime) -> list[str]:
    """What this replica serves without, in words (empty when nothing): the dashboard's banner."""
    reasons = []
    health = runtime.store.health
    if not health.up:
        serving = (
            "budgets and rate limits on this replica's own counts, within its share of each budget"
            if health.serving
            else "refusing requests (on_failure: fail_closed)"
        )
        reasons.append(f"shared store unreachable ({health.fault or 'no answer'}): {serving}")
    if not runtime.ledger.up:
        reasons.append(f"ledger unreachable: {runtime.ledger.pending} rows wait in memory")
    return reasons


def _routes(
    runtime: Runtime,
    today: dict[str, tuple[float, int]],
    view: LedgerSnapshot,
    series: dict[str, list[float]],
) -> list[dict[str, Any]]:
    # "" holds requests refused before they named a route: they show under "refused", not as a route.
    names = list(runtime.policy.routes) + sorted(set(today) - set(runtime.policy.routes) - {""})
    rows = []
    for name in names:
        usd, requests = today.get(name, (0.0, 0))
        seen = view.routes.get(name)
        rows.append(
            {
                "route": name,
                "today_usd": usd,
                "today_requests": requests,
                "last_hour_usd": sum(series.get(name, ())),
                "errors_today": 0 if seen is None else seen.errors,
                "fallbacks_today": 0 if seen is None else seen.fallbacks,
                "refused_today": 0 if seen is None else seen.refused,
            }
        )
    return rows


def pool_rows(policy: CompiledPolicy, view: LedgerSnapshot) -> list[dict[str, Any]]:
    """Each GPU-hour pool today: its price times the hours since midnight UTC (or since the ledger's
    first row, if later), split into what requests were charged and the idle rest."""
    if view.read_at is None:
        return []
    start = max(view.day_start, view.earliest if view.earliest is not None else view.read_at)
    hours = max(0.0, view.read_at - start) / SECONDS_PER_HOUR
    rows = []
    for name, backend in policy.backends.items():
        if backend.pool_price is None:
            continue
        total = backend.pool_price.usd_per_hour * hours
        seen = view.backends.get(name)
        attributed = 0.0 if seen is None else seen.cost_usd
        rows.append(
            {
                "backend": name,
                "usd_per_hour": backend.pool_price.usd_per_hour,
                "hours": hours,
                "attributed_usd": attributed,
                "idle_usd": max(0.0, total - attributed),
                "pool_usd": total,
                "requests": 0 if seen is None else seen.requests,
            }
        )
    return rows


def capacity_rows(runtime: Runtime) -> list[dict[str, Any]]:
    """Each GPU-hour pool now: the idle part of its hour and the replicas the autoscaler signal asks for."""
    policy = runtime.policy
    pools = pools_of(policy)
    views = runtime.stats.snapshot(tuple(pools))
    desired = runtime.demand.desired_replicas(policy, lambda name: views[name].decode_tokens_per_s)
    return [
        {
            "pool": name,
            "idle_usd_per_hour": idle_usd_per_hour(backend, views[name].aggregate_tokens_per_s),
            "replicas_today": None if backend.scaling is None else backend.scaling.replicas,
            "desired_replicas": desired.get(name),
            "boot_s": None if backend.scaling is None else backend.scaling.boot_s,
        }
        for name, backend in pools.items()
    ]


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


def _local_recent(runtime: Runtime, wall: float) -> list[dict[str, Any]]:
    """This process's last requests, newest start first (the time shown is when each started)."""
    shown = [_recent(runtime, o, wall) for o in list(runtime.recent)[-RECENT_SHOWN:]]
    return sorted(shown, key=lambda r: r["time"], reverse=True)


def _recent(runtime: Runtime, observation: Observation, wall: float) -> dict[str, Any]:
    final = observation.final
    return {
        "time": wall - (runtime.clock() - observation.started_at),
        "request_id": observation.request_id,
        "replica": runtime.replica,
        "route": observation.route,
        "backend": observation.backend,
        "tried": [a.backend for a in observation.attempts],
        "attempts": len(observation.attempts),
        "reason": observation.decision_reason,
        "status": observation.status if observation.status == "ok" else observation.error_type,
        "cost_usd": observation.cost_usd,
        "expected_cost_usd": observation.expected_cost_usd,
        "ttft_s": None if final is None else final.ttft_s,
        "api_key": observation.api_key_name,
    }


def _fleet_recent(view: LedgerSnapshot) -> list[dict[str, Any]]:
    """The fleet's newest rows as the shared ledger has them (already newest start first)."""
    return [
        {
            "time": row["time"],
            "request_id": row["request_id"],
            "replica": row["replica"],
            "route": row["route"],
            "backend": row["backend"],
            "tried": [],
            "attempts": row["attempts"],
            "reason": row["decision_reason"],
            "status": row["status"] if row["status"] == "ok" else row["error_type"],
            "cost_usd": row["cost_usd"],
            "expected_cost_usd": None,
            "ttft_s": row["ttft_s"],
            "api_key": row["api_key_name"],
        }
        for row in view.recent
    ]


routes = [
    Route("/dashboard", page, methods=["GET"]),
    Route("/dashboard/data", admin_only(data), methods=["GET"]),
    Mount("/dashboard/static", app=StaticFiles(directory=STATIC_DIR), name="dashboard-static"),
    Route("/metrics", admin_only(metrics), methods=["GET"]),
]
