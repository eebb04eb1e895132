"""What the ledger holds: one ``LedgerRow`` per request, built from its observation, and the
``SpendTotal`` the reports sum rows into."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from gateway.values.observation import Observation


class LedgerRow(NamedTuple):
    """One request. ``time`` is the wall-clock start in Unix seconds; costs are USD; durations seconds.

    A tuple in column order: built once per request and handed to the database as is.
    """

    time: float
    request_id: str
    api_key_name: str | None  # the key's name from the policy, never the key itself
    route: str  # "" for a request refused before it named a route of the policy
    endpoint: str
    stream: bool
    backend: str | None  # the last backend tried (the one that answered, when one did)
    upstream_model: str | None
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int  # includes reasoning tokens
    reasoning_tokens: int
    usage_source: str | None  # "reported" by the upstream or "counted" by the gateway; None: no usage
    cost_usd: float
    cost_basis: str | None  # "per_token", "gpu_hours_amortized", "gpu_hours_unmeasured"
    reserved_usd: float | None  # what budget admission reserved, to audit predictions against costs
    ttft_s: float | None
    first_answer_s: float | None
    decode_tokens_per_s: float | None
    duration_s: float | None
    status: str  # "ok", "error", "cancelled" (the client left) or "refused" (turned away by the gateway)
    error_type: str | None
    attempts: int
    decision_reason: str | None
    replica: str | None = None  # the gateway process that served it (GATEWAY_REPLICA, or host:pid)
    # Schema 3: what the request used and went through.
    prefill_cost_usd: float | None = None  # a pool's share of cost_usd for processing the prompt
    queued_s: float = 0.0  # seconds waiting in the route's queue for a free or unpaused candidate
    attempt_log: str = ""  # each attempt, in order, as a JSON array (see ``attempt_log``)
    probe: bool = False  # a synthetic probe (the ``probes`` table): billed to no route or key
    # Schema 4: a keyed hash of the client's user id (``ledger.user: hashed``), never the id itself.
    user_hash: str | None = None
    # Schema 5: the cached prompt tokens the prefix index predicted on the backend that answered
    # (reported ones are ``cached_prompt_tokens``); None where nothing was predicted.
    predicted_cached_tokens: int | None = None
    # Schema 6: how many requests the row stands for: 1, or a minute's refusals of one reason, key,
    # route and door folded into one row past their own bound (``ledger/refused.py``).
    request_count: int = 1


# Written with every row: its fields, then the row key the writer gives it (unique per row, so a
# batch retried after an unclear failure, say a connection cut at commit, is not counted twice).
COLUMNS: tuple[str, ...] = (*LedgerRow._fields, "row_key")
PROBE_COLUMN = COLUMNS.index("probe")


def split_probes(rows: Sequence[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Rows for the ``requests`` table, and the synthetic probes' rows for the ``probes`` table."""
    requests = [row for row in rows if not row[PROBE_COLUMN]]
    probes = [row for row in rows if row[PROBE_COLUMN]]
    return requests, probes


class SpendTotal(NamedTuple):
    """Spend summed over ledger rows sharing a key (a route, a backend, an API key name...)."""

    key: str | None
    requests: int
    errors: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float
    bases: str  # the cost bases seen, comma-separated
    fallbacks: int = 0  # requests that needed more than one attempt
    refused: int = 0  # of ``errors``: requests the gateway turned away before trying a backend


GROUP_COLUMNS: Mapping[str, str] = MappingProxyType(
    {"route": "route", "backend": "backend", "key": "api_key_name", "replica": "replica", "user": "user_hash"}
)


def row_of(
    observation: Observation,
    started_wall: float,
    upstream_model: str | None,
    reserved_usd: float | None,
    replica: str | None = None,
) -> LedgerRow:
    """The ledger row of a finished request: tokens summed over its attempts, timings of the last one."""
    prompt = cached = completion = reasoning = 0
    source: str | None = None
    for attempt in observation.attempts:
        usage = attempt.usage
        if usage is not None:
            prompt, cached = prompt + usage.prompt_tokens, cached + usage.cached_prompt_tokens
            completion, reasoning = completion + usage.completion_tokens, reasoning + usage.reasoning_tokens
            source = "counted" if usage.source == "counted" or source == "counted" else "reported"
    final = observation.final
    finished = observation.finished_at
    return LedgerRow(
        started_wall,
        observation.request_id,
        observation.api_key_name,
        observation.route,
        observation.endpoint,
        observation.stream,
        observation.backend,
        upstream_model,
        prompt,
        cached,
        completion,
        reasoning,
        source,
        observation.cost_usd or 0.0,
        observation.cost_basis,
        reserved_usd,
        final.ttft_s if final else None,
        final.first_answer_s if final else None,
        final.decode_tokens_per_s if final else None,
        None if finished is None else finished - observation.started_at,
        observation.status,
        observation.error_type,
        len(observation.attempts),
        observation.decision_reason,
        replica,
        observation.prefill_cost_usd,
        observation.queued_s,
        attempt_log(observation),
        observation.endpoint == "probe",
        observation.user_hash,
        observation.predicted_cached_tokens,
    )


def attempt_log(observation: Observation) -> str:
    """Every attempt of a request, in order, as a JSON array: backend, status, HTTP status, its own
    tokens and cost, and how it took over a stream another backend broke off ("continued" or
    "restarted"). SQLite's ``json_extract`` and PostgreSQL's ``->>`` read it."""
    return orjson.dumps(
        [
            {
                "backend": a.backend,
                "status": a.status,
                "http_status": a.http_status,
                "prompt_tokens": a.usage.prompt_tokens if a.usage else 0,
                "completion_tokens": a.usage.completion_tokens if a.usage else 0,
                "cost_usd": a.cost_usd or 0.0,
                "resumed": a.resumed,
            }
            for a in observation.attempts
        ]
    ).decode()
