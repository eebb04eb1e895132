"""Requests the gateway turns away, made visible: bad JSON, an unknown model, a door's 400, a missing or
wrong key, a body too large or too slow, a rate limit or a budget (errors with ``refusal`` set).

Each one ends like any request, settled once: it gets a ledger row with status ``refused``, its reason
(the error's code, a vocabulary of the gateway's own) as the row's error type, the route and key when
they are known, so ``gateway spend``, the dashboard and the metrics count it by reason (past a bound per
minute the ledger folds a reason's refusals into one counting row, ``ledger/refused.py``); and a log line
at info, at most a few a minute per reason and key (``ledger/refusal_lines.py``). A request shed before
its body is read (``runtime.admission``) is not one of them: a flood of those costs no row.
"""

from __future__ import annotations

import logging

import orjson

from gateway.doors.openai import route_of
from gateway.errors import GatewayError
from gateway.log_text import log_text
from gateway.policy.compiled import CompiledPolicy
from gateway.request.exchange import Exchange
from gateway.values.observation import Observation

log = logging.getLogger("gateway")
LOGGED_MESSAGE_CHARS = 300


def reason_of(error: GatewayError) -> str:
    """What a refusal is counted under: the error's code, else its type (both the gateway's words)."""
    return error.code or error.type


def refuse(exchange: Exchange, error: GatewayError) -> None:
    """Mark ``exchange`` refused by ``error`` and say so in the log; its settling writes the row."""
    observation = exchange.observation
    if observation is None:  # turned away before its body named a route: the row names none
        observation = exchange.observation = observation_of(exchange, "", stream=False)
    reason = reason_of(error)
    if observation.error_type is None:
        observation.status, observation.error_type = "refused", reason
    if not exchange.runtime.ledger.refused.lines.allow(reason, observation.api_key_name or "-", log):
        return  # a flood of refusals is a few lines a minute, not a line each
    message = log_text(error.message[:LOGGED_MESSAGE_CHARS])  # it may quote the client: no control chars
    log.info(
        "refused request %s: %s (%d %s; route %s, key %s): %s",
        exchange.request_id,
        reason,
        error.status,
        exchange.door.name,
        observation.route or "-",
        observation.api_key_name or "-",
        message,
    )


def observation_of(exchange: Exchange, route: str, *, stream: bool) -> Observation:
    """A request's observation once its route is known (``""`` when it names none)."""
    client = exchange.client
    return Observation(
        request_id=exchange.request_id,
        route=route,
        endpoint=exchange.door.name,
        stream=stream,
        started_at=exchange.started_at,
        prompt_chars=0 if client is None else client.prompt_chars,
        max_tokens=None if client is None else client.max_tokens,
        api_key_name=None if exchange.key is None else exchange.key.name,
    )


def named_in(body: bytes, policy: CompiledPolicy) -> tuple[str, bool]:
    """The route and streaming a body the door refused asks for, so its row can name them: ``""`` when
    the body is no JSON object or names no route of the policy (its own words never reach the ledger)."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", False
    if not isinstance(request, dict):
        return "", False
    stream = request.get("stream") is True
    try:
        return route_of(request.get("model"), policy).name, stream  # as the doors resolve it
    except GatewayError:
        return "", stream
