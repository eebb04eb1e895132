"""The simulated prober skips a look when nothing its outcome depends on changed since the last one
(its look keys: bars, health, circuit, idleness...) and nothing is due by time (``ProbePlan.quiet_until``):
a run must come out exactly as one in which every look runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.measure.probe_plan import ProbePlan
from gateway.measure.stats import ProbeView
from gateway.policy.load import load_policy
from gateway.simulate.engine import PolicyRouter, RunResult, Simulation
from gateway.simulate.workload import read_workload_file, synthesize

REPO = Path(__file__).resolve().parents[2]


def _kimi_day(scale: float) -> tuple[RunResult, dict[str, int], int]:
    spec = read_workload_file(REPO / "bench" / "workloads" / "kimi-day.yaml")
    assert spec.arrivals is not None
    spec = spec.model_copy(update={"arrivals": spec.arrivals.model_copy(update={"scale": scale})})
    policy = load_policy(REPO / "policies" / "default.yaml")
    sim = Simulation(policy, synthesize(spec), PolicyRouter("default"))
    looks = 0
    look = sim.prober._look

    def counted(now: float, seen: list[ProbeView]) -> None:
        nonlocal looks
        looks += 1
        look(now, seen)

    sim.prober._look = counted  # type: ignore[method-assign]
    result = sim.run()
    return result, dict(sim.prober.sent), looks


@pytest.mark.slow
@pytest.mark.pure_python  # counts the prober's looks through a patched method
def test_skipped_looks_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # kimi-day has the B300 pool die (probes find it back) and the API slow down for an hour.
    skipping, sent, looks = _kimi_day(1 / 32)
    monkeypatch.setattr(ProbePlan, "quiet_until", lambda *_: float("-inf"))  # every look runs
    every, sent_every, looks_every = _kimi_day(1 / 32)
    assert looks < 0.9 * looks_every  # it does skip
    assert sent == sent_every and sum(sent.values()) > 0
    assert skipping.outcomes == every.outcomes
    assert skipping.api_usd == every.api_usd
