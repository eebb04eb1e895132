"""The simulation's request path: the performance model's timings, the gateway's own decision, faults
and fallback, budgets running out, and the emulators' profiles as the one source of parameters."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.emulator import PROFILES
from gateway.simulate.backends import BackendModel as Model
from gateway.simulate.backends import FailureKind, Job
from gateway.simulate.timeline import Timeline
from gateway.simulate.workload import BackendModel, Fault, WorkloadError, backend_profile
from tests.simulate.tiny import backends, request, run, tiny_policy, ttfts


class Recorder:
    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.events: list[tuple[str, float, int]] = []

    def first_token(self, job: Job) -> None:
        self.events.append(("first", self.timeline.now, job.owner))

    def finished(self, job: Job) -> None:
        self.events.append(("done", self.timeline.now, job.owner))

    def failed(self, job: Job, kind: FailureKind) -> None:
        self.events.append((kind, self.timeline.now, job.owner))


def test_continuous_batching_slows_every_stream_as_the_emulator_does() -> None:
    profile = PROFILES["b300-vllm"].with_overrides(
        {"ttft_min_s": 1.0, "ttft_max_s": 1.0, "prefill_s_per_token": 0.0}
    )
    timeline = Timeline()
    sink = Recorder(timeline)
    model = Model("b300", profile, timeline, random.Random(0), sink)
    # Two streams of 93 tokens: both seated, so each decodes at 92 * 2 ** -0.25 tok/s.
    model.submit(Job(10, 93, 0))
    model.submit(Job(10, 93, 1))
    timeline.drain()
    per_stream = 92.0 * 2**-0.25
    assert sink.events[:2] == [("first", 1.0, 0), ("first", 1.0, 1)]
    done = [e for e in sink.events if e[0] == "done"]
    assert [e[2] for e in done] == [0, 1]
    assert done[0][1] == pytest.approx(1.0 + 92 / per_stream)


def test_a_stream_speeds_up_when_the_other_leaves() -> None:
    profile = PROFILES["b300-vllm"].with_overrides(
        {"ttft_min_s": 0.0, "ttft_max_s": 0.0, "batching_exponent": 1.0, "prefill_s_per_token": 0.0}
    )
    timeline = Timeline()
    sink = Recorder(timeline)
    model = Model("pool", profile, timeline, random.Random(0), sink)
    model.submit(Job(1, 1 + 46, 0))  # 46 tokens after the first at 46 tok/s (two running): done at 1 s
    model.submit(Job(1, 1 + 92 + 46, 1))  # 46 tokens by 1 s, then 92 alone at 92 tok/s: done at 2 s
    timeline.drain()
    done = {owner: at for kind, at, owner in sink.events if kind == "done"}
    assert done[0] == pytest.approx(1.0)
    assert done[1] == pytest.approx(2.0)


def test_the_policy_decides_with_the_gateways_own_code(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path, pool_extra="max_concurrency: 1")
    # Marginal pool: free while it has headroom. r1 at 0.5 s: the pool is at its max concurrency,
    # so the API. r2 at 10 s: the pool again, its measured TTFT (1 s) within the SLO.
    result = run(policy, [request(0.0), request(0.5), request(10.0)])
    assert backends(result) == ["pool", "api", "pool"]


def test_a_backend_down_falls_back_and_drops_streams_under_way(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    down = (Fault(backend="pool", kind="down", start_s=1.5, end_s=100.0),)
    # r0 streams on the pool from 1 s and dies at 1.5 s: its bytes reached the client, no fallback.
    # r1 at 3 s: the pool refuses connections; the API answers.
    result = run(policy, [request(0.0), request(3.0)], faults=down)
    first, second = result.outcomes
    assert (first.ok, first.error) == (False, "upstream_dropped")
    assert (second.ok, second.backend) == (True, "api")


def test_booting_and_error_windows(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    faults = (Fault(backend="pool", kind="booting", start_s=0.0, end_s=5.0),
              Fault(backend="api", kind="errors", start_s=0.0, end_s=20.0, error_rate=1.0))  # fmt: skip
    # At 1 s the pool answers 503 (booting) and the API 500: the request fails after both tries.
    # At 30 s both are well again.
    result = run(policy, [request(1.0), request(30.0)], faults=faults)
    assert [(o.ok, o.attempts) for o in result.outcomes] == [(False, 2), (True, 1)]


def test_slow_window_adds_ttft(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path, route_extra="")
    slow = (Fault(backend="pool", kind="slow", start_s=0.0, end_s=50.0, added_ttft_ms=400.0, slowdown=2.0),)
    result = run(policy, [request(0.0)], faults=slow)
    assert ttfts(result) == [1.4]


def test_budget_exhaustion_is_timed(tmp_path: Path) -> None:
    policy = tiny_policy(
        tmp_path, route_extra="budgets: {per_day_usd: 0.0025, on_exhausted: fallback_cheaper}"
    )
    # The pool's reservation is its amortized price ($100/1M at the assumed 100 tok/s: $0.01 for
    # max_tokens 100), over the cap: the budget falls back to the API, whose answer costs 100 tokens
    # x $15/1M = $0.0015. r0 fits; r1 at 10 s would pass $0.0025: refused.
    result = run(policy, [request(0.0, 100, 0, 100), request(10.0, 100, 0, 100)])
    assert [o.ok for o in result.outcomes] == [True, False]
    assert result.outcomes[1].error == "budget_exhausted"
    assert result.budget_exhausted_at == {"route r": 10.0}


def test_profiles_come_from_the_emulators() -> None:
    assert backend_profile(None, "vllm") is PROFILES["b300-vllm"]
    smaller = backend_profile(BackendModel(profile="b300-vllm", overrides={"max_running": 8}), "vllm")
    assert smaller.max_running == 8 and smaller.tokens_per_s == PROFILES["b300-vllm"].tokens_per_s
    with pytest.raises(WorkloadError, match="unknown profile parameter"):
        backend_profile(BackendModel(profile="b300-vllm", overrides={"seats": 8}), "vllm")
    with pytest.raises(WorkloadError, match="unknown profile"):
        backend_profile(BackendModel(profile="h100-sglang"), "vllm")


@pytest.mark.parametrize("probes", [True, False])
def test_probes_bring_a_pool_back_after_a_slow_spell_as_the_gateway_would(
    tmp_path: Path, probes: bool
) -> None:
    policy = tiny_policy(tmp_path, probes=probes)
    # A request every 2 s for 200 s; the pool's first token 4 s later from 20 s to 60 s.
    spell = (Fault(backend="pool", kind="slow", start_s=20.0, end_s=60.0, added_ttft_ms=4000),)
    result = run(policy, [request(2.0 * i) for i in range(100)], faults=spell)
    during = [o.backend for o in result.outcomes if 30 <= o.at < 60]
    assert during.count("api") == len(during), "the slow pool is left"
    back = [o.at for o in result.outcomes if o.at >= 60 and o.backend == "pool"]
    if probes:
        # Probed at the 15 s interval, then confirmed at once: back well inside 20 s of the spell's end.
        assert back and back[0] - 60 <= 20, back[:3]
    else:
        assert not back or back[0] - 60 > 60, "without probes nothing measures the avoided pool"


@pytest.mark.parametrize(("max_wait_s", "second"), [(10, "ok"), (0.5, "backends_busy"), (0, "backends_busy")])
def test_a_request_finding_its_pool_full_waits_within_the_routes_bound(
    tmp_path: Path, max_wait_s: float, second: str
) -> None:
    policy = tiny_policy(
        tmp_path,
        route_extra=f"waiting: {{max_wait_s: {max_wait_s}}}",
        pool_extra="max_concurrency: 1",
        backends="pool",
    )
    # The one seat is busy from 0 s to 2 s (1 s TTFT, 100 tokens at 100 tok/s): the second request waits.
    result = run(policy, [request(0.0), request(0.1)])
    first, then = result.outcomes
    assert first.ok and first.backend == "pool"
    assert (then.error or "ok") == second
    if second == "ok":
        assert then.backend == "pool" and then.ttft_s == pytest.approx(2.0 + 1.0 - 0.1)
