"""Plans judged in forked workers (one per core) come back exactly as judged one after the other in
this process, in the plans' order (though told as they finish, the longest begun first): each replay
is seeded and independent of the others."""

from __future__ import annotations

from pathlib import Path

from gateway.advise.judging import judge_plans
from gateway.advise.plans import PlanResult, fixed_plan
from gateway.advise.traffic import pool_models
from tests.simulate.tiny import request, tiny_policy, tiny_workload


def test_plans_judged_in_two_workers_equal_those_judged_in_turn(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    workload = tiny_workload([request(0.5 * i, output=301) for i in range(400)], duration_s=600.0)
    pools = pool_models(policy, workload, None)
    plans = [fixed_plan(name, {"pool": n}, workload.duration_s) for name, n in (("none", 0), ("one", 1))]
    told: list[PlanResult] = []
    in_turn = judge_plans(policy, workload, plans, pools, 0, workers=1)
    forked = judge_plans(policy, workload, plans, pools, 0, workers=2, done=told.append)
    assert forked == in_turn
    assert sorted(told, key=lambda r: r.plan.name) == sorted(in_turn, key=lambda r: r.plan.name)
    assert [r.plan.name for r in forked] == ["none", "one"]
    assert forked[0].api_usd > forked[1].api_usd > 0, "the plans must differ, or nothing is compared"
