"""The candidate plans judged side by side: each is a whole replay through the simulator, independent
of the others, so they run in forked worker processes, one per core (the policy holds read-only
mappings that do not pickle: a fork inherits them, and only each plan's index goes out and its priced
result comes back). One core, one plan, or no ``fork`` on the platform: in this process, in order."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable

from gateway.advise.plans import Plan, PlanResult, run_plan
from gateway.advise.traffic import PoolModel
from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.workload import Workload

Done = Callable[[PlanResult], None]  # told as each plan's result comes in, in the order they finish

# What the forked workers read: set just before the fork, cleared after.
_job: tuple[CompiledPolicy, list[tuple[Workload, Plan]], list[PoolModel], int] | None = None


def _judge(index: int) -> tuple[int, PlanResult]:
    assert _job is not None
    policy, runs, pools, seed = _job
    workload, plan = runs[index]
    return index, run_plan(policy, workload, plan, pools, seed)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def judge_plans(
    policy: CompiledPolicy,
    workload: Workload,
    plans: list[Plan],
    pools: list[PoolModel],
    seed: int,
    *,
    workers: int,
    done: Done | None = None,
) -> list[PlanResult]:
    """Each plan's result, in the plans' order."""
    return judge_runs(policy, [(workload, plan) for plan in plans], pools, seed, workers=workers, done=done)


def judge_runs(
    policy: CompiledPolicy,
    runs: list[tuple[Workload, Plan]],
    pools: list[PoolModel],
    seed: int,
    *,
    workers: int,
    done: Done | None = None,
) -> list[PlanResult]:
    """Each (traffic, plan) replay's result, in the runs' order: the plans over the whole run, or
    over each sampled day (``sampling.py``)."""
    global _job
    workers = min(workers, len(runs))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        results = []
        for workload, plan in runs:
            results.append(run_plan(policy, workload, plan, pools, seed))
            if done is not None:
                done(results[-1])
        return results
    _job = (policy, runs, pools, seed)
    # The longest replays first (a sampled weekday before a weekend day, a partial day last), so no
    # core is left with a long one alone at the end.
    longest_first = sorted(range(len(runs)), key=lambda i: -len(runs[i][0].requests))
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            by_index: dict[int, PlanResult] = {}
            for index, result in pool.imap_unordered(_judge, longest_first):
                by_index[index] = result
                if done is not None:
                    done(result)
            return [by_index[i] for i in range(len(runs))]
    finally:
        _job = None
