"""The plan search: the capacity model proposes (the cheapest fixed replicas per pool, an hour-of-day
schedule), the simulator judges (every candidate replayed through the real decision code), and the
cheapest plan that keeps the SLO target is recommended. Today's capacity and all-API are always judged
too, so the saving is against what runs now."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.advise.judging import judge_plans
from gateway.advise.plans import Plan, PlanResult, fixed_plan
from gateway.advise.runs import Run, WorkloadRun
from gateway.advise.sampling import SAMPLE_AFTER_S, DaySample, day_cuts, judge_sampled, sample_days
from gateway.advise.schedule import (
    DayKind,
    Window,
    daily_windows,
    day_kinds,
    has_daily_shape,
    hour_of_day_needs,
    spells_in_run,
)
from gateway.advise.traffic import (
    HourTraffic,
    PoolModel,
    busiest_day,
    hourly_replicas,
    pool_models,
)
from gateway.measure.capacity import streams_in_flight
from gateway.measure.demand import spill_usd_per_token
from gateway.money.costs import SECONDS_PER_HOUR
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.workload import Workload

SENSITIVITY = 1.2  # the traffic the answer is checked against: 20% more
MIN_SCHEDULE_S = 12 * 3600.0  # shorter runs show no day to shape a schedule on


class Sensitivity(NamedTuple):
    """One pool's sizing now and with ``SENSITIVITY`` times the traffic."""

    peak_replicas: int
    peak_replicas_at_scale: int
    replica_hours_per_day: int
    replica_hours_per_day_at_scale: int


@dataclass
class Advice:
    workload: str
    requests: int
    days_seen: float
    slo_target: float
    pools: list[PoolModel]
    results: list[PlanResult]  # today's capacity first
    recommended: PlanResult
    windows: dict[str, list[Window]] = field(default_factory=dict)  # the schedule, per pool
    hourly: dict[str, list[int]] = field(default_factory=dict)  # the model's replicas per hour of day
    sensitivity: dict[str, Sensitivity] = field(default_factory=dict)
    day_kinds: list[DayKind] = field(default_factory=list)  # the schedule's kinds of day
    samples: list[DaySample] = field(default_factory=list)  # the days replayed; none: every day was
    days_cut: int = 0  # the run's days (cut at UTC midnights), of which ``samples`` were replayed
    busiest_day: list[float] = field(default_factory=list)  # requests/s per hour of day, the busiest's

    @property
    def today(self) -> PlanResult:
        return self.results[0]

    def result(self, name: str) -> PlanResult | None:
        return next((r for r in self.results if r.plan.name == name), None)


def advise(
    policy: CompiledPolicy,
    traffic: Workload | Run,
    slo_target: float,
    *,
    seed: int = 0,
    max_replicas: int | None = None,
    progress: Callable[[PlanResult, int], None] | None = None,
    workers: int = 1,
    sample: bool | None = None,
) -> Advice:
    """``progress`` is told each replay's result as it comes in, with how many replays there are;
    ``workers`` replays run at once (``judging.py``). ``sample``: replay a sample of the days
    (``sampling.py``); by default only when the run is longer than a week. ``traffic``: a workload
    in memory, or a run read a day at a time (``runs.py``, ``ledger_run.py``)."""
    run = WorkloadRun(traffic) if isinstance(traffic, Workload) else traffic
    summary = run.summary()
    pools = pool_models(policy, run, max_replicas)
    hours = summary.hours
    per_hour = hourly_replicas(policy, pools, hours)
    duration = run.duration_s
    start_wall = run.start_wall
    candidates = [
        fixed_plan("today", {p.name: p.replicas_today for p in pools}, duration),
        fixed_plan("all-api", {p.name: 0 for p in pools}, duration),
    ]
    best = {p.name: cheapest_fixed(policy, p, hours) for p in pools}
    candidates.append(fixed_plan("model-fixed", best, duration))
    if pools and best[pools[0].name] < pools[0].shape.max_replicas:
        candidates.append(
            fixed_plan("model-fixed+1", {**best, pools[0].name: best[pools[0].name] + 1}, duration)
        )
    needs = {p.name: hour_of_day_needs(per_hour[p.name], start_wall) for p in pools}
    kinds = day_kinds(start_wall, duration)
    by_kind = {
        kind: {p.name: hour_of_day_needs(per_hour[p.name], start_wall, kind) for p in pools} for kind in kinds
    }
    windows: dict[str, list[Window]] = {}
    if duration >= MIN_SCHEDULE_S and any(has_daily_shape(n) for n in needs.values()):
        windows = {
            p.name: [w for kind in kinds for w in daily_windows(by_kind[kind][p.name], p.boot_s, kind)]
            for p in pools
        }
        spells = {
            p.name: [s for _, s in sorted(spells_in_run(windows[p.name], start_wall, duration).items())]
            for p in pools
        }
        label = ", ".join(f"{p.name} {min(needs[p.name])}-{max(needs[p.name])} by hour" for p in pools)
        candidates.append(Plan("schedule", spells, label))
        candidates.append(fixed_plan("always-on", {p.name: max(needs[p.name]) for p in pools}, duration))
    judged: list[Plan] = []
    seen: set[str] = set()
    for plan in candidates:
        if plan.label in seen and plan.name != "schedule":
            continue  # the same capacity judged once, under its first name
        seen.add(plan.label)
        judged.append(plan)
    if sample is None:
        sample = duration > SAMPLE_AFTER_S
    samples = sample_days(run, summary.day_requests) if sample else []
    if samples:
        results = judge_sampled(policy, run, judged, pools, seed, samples, workers=workers, done=progress)
    else:
        done = None if progress is None else (lambda result: progress(result, len(judged)))
        results = judge_plans(policy, run.whole(), judged, pools, seed, workers=workers, done=done)
    keeping = [r for r in results if r.slo_attainment >= slo_target]
    recommended = (
        min(keeping, key=lambda r: r.total_usd) if keeping else max(results, key=lambda r: r.slo_attainment)
    )
    return Advice(
        workload=run.name,
        requests=summary.requests,
        days_seen=duration / 86_400.0,
        slo_target=slo_target,
        pools=pools,
        results=results,
        recommended=recommended,
        windows=windows,
        hourly=by_kind[kinds[0]],
        day_kinds=kinds,
        sensitivity=sensitivity(policy, pools, hours, start_wall, needs),
        samples=samples,
        days_cut=len(day_cuts(run)),
        busiest_day=busiest_day(hours, start_wall),
    )


def cheapest_fixed(policy: CompiledPolicy, pool: PoolModel, hours: list[HourTraffic]) -> int:
    """The always-on replicas the model finds cheapest over the run: hours paid against the API's
    price for the streams they would not hold."""
    api = spill_usd_per_token(policy, pool.routes)
    shape = pool.shape
    streams = [streams_in_flight(h.demand(pool.routes), shape) for h in hours]

    def cost(n: int) -> float:
        if api is None:  # nothing to spill to: too few replicas is no plan at all
            return math.inf if max(streams, default=0) > n * shape.streams else n * shape.usd_per_hour
        spill = sum(max(0.0, s - n * shape.streams) for s in streams)
        return (
            n * shape.usd_per_hour * len(hours) + spill * shape.stream_tokens_per_s * SECONDS_PER_HOUR * api
        )

    return min(range(shape.max_replicas + 1), key=cost)


def sensitivity(
    policy: CompiledPolicy,
    pools: list[PoolModel],
    hours: list[HourTraffic],
    start_wall: float,
    needs: Mapping[str, list[int]],
) -> dict[str, Sensitivity]:
    """What the model asks for with 20% more traffic: peak replicas and replica-hours per day."""
    more = hourly_replicas(policy, pools, hours, SENSITIVITY)
    out = {}
    for p in pools:
        busier = hour_of_day_needs(more[p.name], start_wall)
        now = needs[p.name]
        out[p.name] = Sensitivity(max(now, default=0), max(busier, default=0), sum(now), sum(busier))
    return out
