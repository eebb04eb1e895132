"""Which days a sampled replay stands on (gateway/advise/sampling.py): every day of the run stood for
exactly once, weekdays and weekends apart, a partial day replayed as itself, and a plan's spells cut
to the replayed day. The fidelity of the sampled replay against a full one is tests/advise/
test_week.py's (same plan, cost within 1%)."""

from __future__ import annotations

from bench.month import month_spec
from gateway.advise.plans import Plan, fixed_plan
from gateway.advise.sampling import DaySample, day_cuts, day_plan, day_workload, sample_days
from gateway.advise.schedule import DAY_S, UpSpell
from gateway.simulate.workload import synthesize


def test_a_month_is_stood_for_day_by_day_by_kind_with_its_partial_day_alone() -> None:
    # 9 whole days from a Monday at a hundredth of the month's traffic, then 6 hours of the tenth.
    workload = synthesize(month_spec(days=10, scale=0.01))
    workload = workload._replace(
        requests=[r for r in workload.requests if r.at < 9.25 * DAY_S], duration_s=9.25 * DAY_S
    )
    samples = sample_days(workload)
    stood_for = sorted(d for s in samples for d in s.stands_for)
    assert len(stood_for) == len(set(stood_for)) == len(day_cuts(workload)) == 10
    assert all(s.date in s.stands_for for s in samples)
    weekend = [s for s in samples if s.kind == "weekend"]
    assert sum(s.weight for s in weekend) == 2 and all(
        d[11:] in ("Sat", "Sun") for s in weekend for d in s.stands_for
    )
    partial = [s for s in samples if s.kind == "partial"]
    assert [(s.start_s, s.end_s, s.weight) for s in partial] == [(9 * DAY_S, 9.25 * DAY_S, 1)]
    assert len(samples) < 10, "days of one kind and level are replayed once"
    for s in samples:  # the traffic weight: the requests stood for over the replayed day's
        own = len(day_workload(workload, s).requests)
        assert own > 0 and s.traffic_weight * own > 0.8 * s.weight * own


def test_a_plan_is_cut_to_the_replayed_day() -> None:
    # A replica up from Monday 20:00 (booting till 21:00) to Tuesday 09:00, drained by 09:10.
    overnight = UpSpell(20 * 3600.0, 21 * 3600.0, DAY_S + 9 * 3600.0, DAY_S + 9 * 3600.0 + 600.0)
    plan = Plan("night", {"b300-vllm": [[overnight]]}, "night")
    tuesday = DaySample(DAY_S, 2 * DAY_S, "2026-03-03 Tue", "weekday", ("2026-03-03 Tue",), 1.0)
    wednesday = DaySample(2 * DAY_S, 3 * DAY_S, "2026-03-04 Wed", "weekday", ("2026-03-04 Wed",), 1.0)
    # Up and ready from Tuesday's start, as it was at midnight; nothing of it on Wednesday.
    assert day_plan(plan, tuesday).spells == {
        "b300-vllm": [[UpSpell(0.0, 0.0, 9 * 3600.0, 9 * 3600.0 + 600.0)]]
    }
    assert day_plan(plan, wednesday).spells == {"b300-vllm": [[]]}
    always = fixed_plan("always", {"b300-vllm": 2}, 3 * DAY_S)
    assert day_plan(always, wednesday).spells == {"b300-vllm": [[UpSpell(0.0, 0.0, DAY_S, DAY_S)]] * 2}
