"""The traffic a plan must carry, hour by hour: arrivals and output lengths per route, from the
replayed workload, and each pool's sizing per hour from the capacity model."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.emulator.profiles import Profile
from gateway.measure.capacity import (
    Demand,
    ReplicaShape,
    replicas_worth_running,
    slo_streams,
    streams_in_flight,
)
from gateway.measure.demand import spill_usd_per_token
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.workload import BackendModel, Workload, backend_profile

HOUR_S = 3600.0
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class HourTraffic:
    """One hour of the run: per route, requests and their output tokens."""

    requests: Mapping[str, int]
    output_tokens: Mapping[str, int]

    def demand(self, routes: list[str], scale: float = 1.0) -> Demand:
        count = sum(self.requests.get(r, 0) for r in routes)
        tokens = sum(self.output_tokens.get(r, 0) for r in routes)
        return Demand(scale * count / HOUR_S, tokens / count if count else 0.0)


def hourly_traffic(workload: Workload) -> list[HourTraffic]:
    """The run cut into hours from its start (the last may be partial, counted as a whole)."""
    hours = max(1, math.ceil(workload.duration_s / HOUR_S))
    requests: list[dict[str, int]] = [{} for _ in range(hours)]
    tokens: list[dict[str, int]] = [{} for _ in range(hours)]
    for req in workload.requests:
        h = min(hours - 1, int(req.at // HOUR_S))
        requests[h][req.route] = requests[h].get(req.route, 0) + 1
        output = req.output_tokens if req.max_tokens is None else min(req.output_tokens, req.max_tokens)
        tokens[h][req.route] = tokens[h].get(req.route, 0) + output
    return [HourTraffic(r, t) for r, t in zip(requests, tokens, strict=True)]


def busiest_day(hours: list[HourTraffic], start_wall: float) -> list[float]:
    """Requests per second by hour of the day (UTC), the busiest day's for each hour."""
    rates = [0.0] * 24
    for h, hour in enumerate(hours):
        hod = int(((start_wall + h * HOUR_S) % DAY_S) // HOUR_S)
        rates[hod] = max(rates[hod], sum(hour.requests.values()) / HOUR_S)
    return rates


@dataclass(frozen=True, slots=True)
class PoolModel:
    """A pool as the capacity model sees it: one replica's shape and the routes it can serve."""

    name: str
    shape: ReplicaShape
    routes: list[str]
    boot_s: float
    replicas_today: int
    profile: Profile


class HasBackends(Protocol):
    @property
    def backends(self) -> Mapping[str, BackendModel]: ...


def pool_models(policy: CompiledPolicy, workload: HasBackends, max_replicas: int | None) -> list[PoolModel]:
    """Each GPU-hour pool, cheapest per token at full load first: the routes whose SLO it can keep
    (TTFT and decode speed), and one replica's SLO-safe streams at their speed."""
    pools = []
    for name, backend in policy.backends.items():
        pool = backend.pool_price
        if pool is None:
            continue
        profile = backend_profile(workload.backends.get(name), backend.dialect)
        seats = min(backend.max_concurrency, profile.max_running or backend.max_concurrency)
        routes, strictest = [], 0.0
        for route in policy.routes.values():
            if name not in route.backends:
                continue
            slo = route.slo
            if slo.ttft_p95_ms is not None and profile.ttft_max_s * 1000.0 > slo.ttft_p95_ms:
                continue
            need = slo.min_decode_tokens_per_s or 0.0
            if slo_streams(profile.tokens_per_s, profile.batching_exponent, seats, need or None) == 0:
                continue
            routes.append(route.name)
            strictest = max(strictest, need)
        streams = slo_streams(profile.tokens_per_s, profile.batching_exponent, seats, strictest or None)
        scaling = backend.scaling
        limit = max_replicas if max_replicas is not None else scaling.max_replicas if scaling else 4
        shape = ReplicaShape(
            usd_per_hour=pool.usd_per_hour,
            streams=max(1, streams),
            stream_tokens_per_s=profile.per_stream_tokens_per_s(max(1, streams)),
            ttft_s=(profile.ttft_min_s + profile.ttft_max_s) / 2,
            max_replicas=limit if routes else 0,
        )
        boot = scaling.boot_s if scaling is not None and scaling.boot_s else profile.cold_boot_s
        today = scaling.replicas if scaling is not None else 1
        pools.append(PoolModel(name, shape, routes, boot, today, profile))
    return sorted(pools, key=lambda p: p.shape.usd_per_hour / (p.shape.streams * p.shape.stream_tokens_per_s))


def hourly_replicas(
    policy: CompiledPolicy, pools: list[PoolModel], hours: list[HourTraffic], scale: float = 1.0
) -> dict[str, list[int]]:
    """Replicas per pool for each hour of the run: cheaper pools take their share of the streams
    first; what a pool does not take is left to the next, then to the API."""
    out: dict[str, list[int]] = {p.name: [] for p in pools}
    for hour in hours:
        taken: dict[str, float] = {}  # streams already held per route, by cheaper pools
        for pool in pools:
            demand = hour.demand(pool.routes, scale)
            left = Demand(demand.arrivals_per_s * _left_share(pool, hour, taken), demand.output_tokens)
            replicas = replicas_worth_running(left, pool.shape, spill_usd_per_token(policy, pool.routes))
            out[pool.name].append(replicas)
            held = min(1.0, replicas * pool.shape.streams / max(1e-9, streams_in_flight(left, pool.shape)))
            for route in pool.routes:
                taken[route] = taken.get(route, 0.0) + (1.0 - taken.get(route, 0.0)) * held
    return out


def _left_share(pool: PoolModel, hour: HourTraffic, taken: Mapping[str, float]) -> float:
    total = sum(hour.requests.get(r, 0) for r in pool.routes)
    if not total:
        return 0.0
    return sum(hour.requests.get(r, 0) * (1.0 - taken.get(r, 0.0)) for r in pool.routes) / total
