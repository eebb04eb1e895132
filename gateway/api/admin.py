"""Operational endpoints: /health (alive), /ready (can serve), /admin/* (explain, policy, backends).

``/admin/explain`` runs the real decision on a hypothetical request without sending anything
upstream, so "why would this go there?" has the same answer as the request path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict, fields
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.bounded import bounded_body
from gateway.api.responses import json_response
from gateway.errors import InvalidRequest, ModelNotFound, PolicyRejected
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import PolicyError
from gateway.request.cache_keys import scoped_client_key
from gateway.runtime import Runtime
from gateway.version import gateway_version

MAX_PARAM_DIGITS = 9


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def health(request: Request) -> Response:
    return json_response({"status": "ok", "version": gateway_version()})


async def ready(request: Request) -> Response:
    report = await runtime_of(request).readiness()
    return json_response(report, status=200 if report["ready"] else 503)


async def explain(request: Request) -> Response:
    runtime = runtime_of(request)
    policy = runtime.policy
    model = request.query_params.get("model", "")
    route = policy.routes.get(model)
    if route is None:
        raise ModelNotFound(
            f"The model '{model[:200]}' does not exist. Known models: {', '.join(policy.routes)}"
        )
    prompt_tokens = _int_param(request, "prompt_tokens", 500) or 0
    max_tokens = _int_param(request, "max_tokens", None)
    cache_key = request.query_params.get("cache_key") or None  # a conversation's client key
    scope = policy.cache_scopes.scope(route.name, _viewer(request, policy))
    scoped = scoped_client_key(scope.seed, cache_key) if cache_key and scope.seed else cache_key
    decision = runtime.explain(route, prompt_tokens, max_tokens, scoped)
    return json_response(
        {
            "route": route.name,
            "objective": route.objective,
            "when_infeasible": route.when_infeasible,
            "slo": route.slo.model_dump(exclude_none=True),
            "request": {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "cache_key": cache_key},
            # Whose prompts the cached tokens count: the caller's scope, or the one of ``key``.
            "cache_scope": scope.label or "fleet",
            "choice": decision.chosen,
            "reason": decision.reason,
            "order": list(decision.order),
            "candidates": [evaluation.as_dict() for evaluation in decision.evals],
        }
    )


def _viewer(request: Request, policy: CompiledPolicy) -> str | None:
    """Whose view of the prefix cache an explanation shows: the key named by ``key`` (an admin asking
    what that key would be told), else the caller's own key; None on a gateway without keys."""
    named = request.query_params.get("key")
    if named:
        if named not in policy.cache_scopes.by_key:
            raise InvalidRequest(f"no API key named '{named[:64]}'", param="key")
        return named
    caller = runtime_of(request).authenticate(policy, request.headers)
    return None if caller is None else caller.name


async def policy_status(request: Request) -> Response:
    runtime = runtime_of(request)
    policy, source = runtime.policy, runtime.policy_source
    return json_response(
        {
            "source": policy.source,
            "digest": policy.digest,
            "routes": list(policy.routes),
            "backends": list(policy.backends),
            "warnings": list(policy.warnings),
            "reloads": getattr(source, "reloads", 0),
            "reload_failures": getattr(source, "reload_failures", 0),
            "last_error": getattr(source, "last_error", None),
        }
    )


async def reload_policy(request: Request) -> Response:
    runtime = runtime_of(request)
    # It takes no body, but one sent is read as the doors read theirs: bounded in size and time.
    await bounded_body(runtime.policy, request)
    source = runtime.policy_source
    reload_checked = getattr(source, "reload_checked", None)
    if reload_checked is None:
        raise InvalidRequest("this gateway runs a fixed policy that cannot be reloaded")
    changed = await asyncio.to_thread(reload_checked)
    if isinstance(changed, PolicyError):
        running = runtime_of(request).policy
        raise PolicyRejected(
            f"the policy file was rejected; still serving sha256 {running.digest[:12]} from "
            f"{running.source}:\n{changed}",
            [str(problem) for problem in changed.problems],
        )
    response = await policy_status(request)
    response.headers["x-gateway-policy-changed"] = "true" if changed else "false"
    return response


async def backends(request: Request) -> Response:
    runtime = runtime_of(request)
    scraped = runtime.scraper.status()
    views: dict[str, Any] = {}
    for name in runtime.policy.backends:
        view = runtime.stats.view(name)
        row = {f.name: getattr(view, f.name) for f in fields(view)}
        row["completion_tokens_by_route"] = dict(view.completion_tokens_by_route)
        row["signals"] = None if view.signals is None else asdict(view.signals)
        row["scrape"] = scraped.get(name)
        views[name] = row
    return json_response({"backends": views})


Handler = Callable[[Request], Awaitable[Response]]


def admin_only(handler: Handler) -> Handler:
    """Admin surfaces need an admin key whenever the policy configures keys."""

    async def guarded(request: Request) -> Response:
        runtime_of(request).authorize_admin(request.headers)
        return await handler(request)

    guarded.__name__ = handler.__name__
    return guarded


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # ASCII digits only (str.isdigit() also takes '²', which int() refuses), and few enough of them
    # that the answer can carry the number: no context window holds a billion tokens.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > MAX_PARAM_DIGITS:
        raise InvalidRequest(f"'{name}' must be a non-negative integer below 10^9", param=name)
    return int(raw)


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/admin/explain", admin_only(explain), methods=["GET"]),
    Route("/admin/policy", admin_only(policy_status), methods=["GET"]),
    Route("/admin/policy/reload", admin_only(reload_policy), methods=["POST"]),
    Route("/admin/backends", admin_only(backends), methods=["GET"]),
]
