"""A long run judged on a sample of its days: the run is cut at UTC midnights, its whole days grouped
by kind (weekday or weekend) and traffic (days within ``LEVEL_BAND`` of each other's requests), one
day per group (its median by requests) replayed for every plan, and each day's bill, tokens and SLO
counts weighted by the days it stands for. A partial first or last day is replayed as itself.

Why: a replay's cost is mostly per virtual second per backend (scrapes, the prober's looks), not per
request, so a month is 30 days of it per plan; the days of one kind and level replay alike. The
fidelity test (tests/advise/test_sampled.py) holds a sampled week to the full replay's plan and cost
within 1%. ``gateway advise --full-replay`` replays every day."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.advise.judging import judge_runs
from gateway.advise.plans import Plan, PlanResult
from gateway.advise.runs import Run, WorkloadRun
from gateway.advise.runs import day_cuts as cuts_of
from gateway.advise.schedule import DAY_S, UpSpell, is_kind
from gateway.advise.traffic import PoolModel
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.workload import Workload

SAMPLE_AFTER_S = 7 * DAY_S  # runs longer than a week are sampled unless told otherwise
LEVEL_BAND = 0.10  # days whose requests are within 10% of the group's quietest day are one level
WHOLE_DAY_S = DAY_S - 3600.0  # a cut at least this long counts as a day (a ledger starts at its first row)


@dataclass(frozen=True, slots=True)
class DaySample:
    """One replayed day: its span in run time, and the days (their UTC dates) it stands for."""

    start_s: float
    end_s: float
    date: str  # the replayed day's, UTC
    kind: str  # "weekday", "weekend" or "partial"
    stands_for: tuple[str, ...]
    traffic_weight: float  # the requests of the days stood for over the replayed day's

    @property
    def weight(self) -> int:
        return len(self.stands_for)


def day_cuts(run: Run | Workload) -> list[tuple[float, float]]:
    """The run cut at each UTC midnight inside it."""
    return cuts_of(run.start_wall, run.duration_s)


def sample_days(run: Run | Workload, counts: Sequence[int] | None = None) -> list[DaySample]:
    """The days to replay, each with the days it stands for; every day of the run is stood for once.
    ``counts``: each day's requests (the run's summary), else counted from the workload's."""
    cuts = day_cuts(run)
    if counts is None:
        assert isinstance(run, Workload)
        counts = WorkloadRun(run).summary().day_requests
    groups: dict[str, list[int]] = {}
    samples = []
    for i, (start, end) in enumerate(cuts):
        if end - start < WHOLE_DAY_S:
            date = _date(run, start)
            samples.append(DaySample(start, end, date, "partial", (date,), 1.0))
            continue
        weekend = is_kind(run.start_wall + start + DAY_S / 2, "Sat-Sun")
        groups.setdefault("weekend" if weekend else "weekday", []).append(i)
    for kind, days in groups.items():
        for level in _levels(days, counts):
            median = sorted(level, key=lambda d: counts[d])[len(level) // 2]
            start, end = cuts[median]
            stands_for = tuple(_date(run, cuts[d][0]) for d in sorted(level))
            traffic = sum(counts[d] for d in level) / counts[median] if counts[median] else len(level)
            samples.append(DaySample(start, end, _date(run, start), kind, stands_for, traffic))
    return sorted(samples, key=lambda s: s.start_s)


def _levels(days: list[int], counts: Sequence[int]) -> list[list[int]]:
    levels: list[list[int]] = []
    for d in sorted(days, key=lambda d: counts[d]):
        if levels and counts[d] <= counts[levels[-1][0]] * (1.0 + LEVEL_BAND):
            levels[-1].append(d)
        else:
            levels.append([d])
    return levels


def _date(run: Run | Workload, at: float) -> str:
    return time.strftime("%Y-%m-%d %a", time.gmtime(run.start_wall + at))


def day_workload(workload: Workload, sample: DaySample) -> Workload:
    """The sampled day as a run of its own: its arrivals and faults, moved to start at zero."""
    return WorkloadRun(workload).day(sample.start_s, sample.end_s)


def day_plan(plan: Plan, sample: DaySample) -> Plan:
    """The plan's spells clipped to the day and moved to start at zero: a replica up across midnight is
    up (and ready, if it was) from the day's start."""
    start, end = sample.start_s, sample.end_s

    def clip(at: float) -> float:
        return min(max(at, start), end) - start

    spells = {
        pool: [
            [
                UpSpell(clip(s.paid_from_s), clip(s.ready_s), clip(s.stop_s), clip(s.paid_until_s))
                for s in replica
                if s.paid_from_s < end and s.paid_until_s > start
            ]
            for replica in replicas
        ]
        for pool, replicas in plan.spells.items()
    }
    return Plan(plan.name, spells, plan.label)


def weighted(plan: Plan, days: Sequence[tuple[DaySample, PlanResult]], duration_s: float) -> PlanResult:
    """The plan over the whole run. What the replicas are paid (and their idle hours) is the plan's
    spells, so each replayed day's counts once per day it stands for; what follows the traffic (the
    API's bill, tokens, requests, SLO and shares) is scaled by the requests of the days it stands for
    over its own, so a replayed day a little busier or quieter than its group does not skew it."""
    pool_usd: dict[str, float] = {}
    share: dict[str, float] = {}
    for s, r in days:
        for pool, usd in r.pool_usd.items():
            pool_usd[pool] = pool_usd.get(pool, 0.0) + s.weight * usd
        answered = s.traffic_weight * (r.requests - r.failures)
        for name, value in r.share.items():
            share[name] = share.get(name, 0.0) + value * answered
    api = sum(s.traffic_weight * r.api_usd for s, r in days)
    total = sum(pool_usd.values()) + api
    output = round(sum(s.traffic_weight * r.output_tokens for s, r in days))
    requests = sum(s.traffic_weight * r.requests for s, r in days)
    answered_all = sum(s.traffic_weight * (r.requests - r.failures) for s, r in days)
    within = sum(s.traffic_weight * r.requests * r.slo_attainment for s, r in days)
    return PlanResult(
        plan=plan,
        total_usd=total,
        pool_usd=pool_usd,
        api_usd=api,
        usd_per_day=total / (duration_s / DAY_S),
        usd_per_mtok=total / output * 1e6 if output else None,
        slo_attainment=within / requests if requests else 0.0,
        share={name: v / answered_all for name, v in share.items()} if answered_all else {},
        idle_gpu_hours=sum(s.weight * r.idle_gpu_hours for s, r in days),
        output_tokens=output,
        requests=round(requests),
        failures=round(sum(s.traffic_weight * r.failures for s, r in days)),
    )


def describe(samples: Sequence[DaySample], days: int) -> list[str]:
    """What the output says about a sampled replay: which days were replayed, standing for which."""
    lines = [f"sampled replay: {len(samples)} of {days} days replayed (--full-replay replays every day)"]
    for s in samples:
        others = [d[:10] for d in s.stands_for if d != s.date]
        also = f", standing for {s.weight} days (also {', '.join(others)})" if others else ""
        lines.append(f"  {s.date} ({s.kind}){also}")
    return lines


def judge_sampled(
    policy: CompiledPolicy,
    run: Run,
    plans: list[Plan],
    pools: list[PoolModel],
    seed: int,
    samples: Sequence[DaySample],
    *,
    workers: int,
    done: Callable[[PlanResult, int], None] | None = None,
) -> list[PlanResult]:
    """Each plan's result over the whole run from its replays of the sampled days (on ``workers``
    cores at once); ``done`` is told each day's replay as it comes in, with how many there are."""
    days = [run.day(s.start_s, s.end_s) for s in samples]  # only these days' requests are read
    runs = [(day, day_plan(plan, s)) for plan in plans for s, day in zip(samples, days, strict=True)]
    told = None if done is None else (lambda result: done(result, len(runs)))
    results = judge_runs(policy, runs, pools, seed, workers=workers, done=told)
    per_plan = len(samples)
    return [
        weighted(
            plan,
            list(zip(samples, results[i * per_plan : (i + 1) * per_plan], strict=True)),
            run.duration_s,
        )
        for i, plan in enumerate(plans)
    ]
