"""Cache-aware decisions: the cached part of a prompt is cheaper and faster where it is held, replicas
of one pool keep a conversation by affinity, and load balance and the SLO guard that affinity."""

from __future__ import annotations

import random
from dataclasses import replace

from gateway.measure.signals import LoadSignals
from gateway.measure.stats import BackendView
from gateway.policy.affinity import replica_groups
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures, decide
from gateway.policy.schema import Slo
from tests.unit.factories import api_backend, policy, pool_backend, route

PROMPT = 100_000


def _view(name: str, ttft_s: float = 1.0, **kw: object) -> BackendView:
    fields: dict[str, object] = {
        "samples": 50,
        "last_sample_at": 1000.0,
        "ttft_p50_s": ttft_s * 0.8,
        "ttft_p95_s": ttft_s,
        "decode_tokens_per_s": 60.0,
        "aggregate_tokens_per_s": 2000.0,
        "service_time_s": 20.0,
        "prefill_tokens_per_s": 12_000.0,
    }
    fields.update(kw)
    return BackendView(name, **fields)  # type: ignore[arg-type]


def _pools(slo_ms: float = 15_000.0) -> tuple[CompiledPolicy, CompiledRoute]:
    backends = [
        replace(pool_backend("b300-a", usd_per_hour=62.93), family="kimi-k3"),
        replace(pool_backend("b300-b", usd_per_hour=62.93), family="kimi-k3"),
        api_backend("api", input_per_mtok=0.6, cached_per_mtok=0.15, output_per_mtok=2.5),
    ]
    kimi = route(("b300-a", "b300-b", "api"), slo=Slo(ttft_p95_ms=slo_ms))
    kimi = replace(kimi, replica_groups=replica_groups(kimi.backends, {b.name: b for b in backends}))
    assert kimi.replica_groups == ((0, 1),)  # the API is another kind of backend
    return policy(backends, [kimi]), kimi


def _decide(cached: dict[str, int], views: dict[str, BackendView], slo_ms: float = 15_000.0) -> Decision:
    pol, kimi = _pools(slo_ms)
    req = RequestFeatures("kimi-k3", PROMPT, 1000, True, cached)
    return decide(req, kimi, pol, views, random.Random(0))


def _idle() -> dict[str, BackendView]:
    return {name: _view(name) for name in ("b300-a", "b300-b", "api")}


def test_a_conversation_stays_on_the_replica_that_holds_its_cache() -> None:
    for holder in ("b300-a", "b300-b"):
        decision = _decide({holder: PROMPT - 2000}, _idle())
        assert decision.chosen == holder
        evaluation = decision.evaluation(holder)
        assert evaluation is not None and evaluation.expected_cached_tokens == PROMPT - 2000
        other = decision.evaluation("b300-b" if holder == "b300-a" else "b300-a")
        assert other is not None and other.expected_cost_usd is not None
        assert evaluation.expected_cost_usd is not None
        assert evaluation.expected_cost_usd < other.expected_cost_usd
        assert other.prefill_s > evaluation.prefill_s == 0.0


def test_the_cached_input_price_makes_a_held_conversation_cheaper_on_the_api() -> None:
    blind = _decide({}, _idle()).evaluation("api")
    held = _decide({"api": PROMPT}, _idle()).evaluation("api")
    assert blind is not None and held is not None
    assert blind.expected_cost_usd is not None and held.expected_cost_usd is not None
    saved = blind.expected_cost_usd - held.expected_cost_usd
    assert abs(saved - PROMPT * (0.6 - 0.15) / 1e6) < 1e-9


def test_a_new_conversation_matching_only_the_shared_prefix_goes_by_load() -> None:
    views = _idle()
    # b300-a served everything so far: it is busier, and its throughput makes it look cheaper per token.
    views["b300-a"] = _view("b300-a", inflight=20, aggregate_tokens_per_s=4000.0)
    views["b300-b"] = _view("b300-b", inflight=2)
    views["api"] = _view("api", healthy=False)  # between the replicas only
    decision = _decide({"b300-a": 1500}, views)  # the system prompt only
    assert decision.chosen == "b300-b"
    assert decision.cached_tokens.get("b300-a", 0) == 0  # a prefix on one replica only counts nowhere


def test_a_replica_out_of_balance_loses_its_affinity() -> None:
    views = _idle()
    views["b300-a"] = _view("b300-a", inflight=40)
    views["b300-b"] = _view("b300-b", inflight=4)
    views["api"] = _view("api", healthy=False)
    assert _decide({"b300-a": PROMPT - 2000}, views).chosen == "b300-b"
    views["b300-a"] = _view("b300-a", inflight=10)  # busier, but within the balance thresholds
    assert _decide({"b300-a": PROMPT - 2000}, views).chosen == "b300-a"


def test_a_conversation_moves_off_a_replica_whose_queue_would_break_the_slo() -> None:
    views = _idle()
    views["api"] = _view("api", healthy=False)  # between the replicas only
    full = LoadSignals(running=64, waiting=0, slots_total=64, scraped_at=1000.0)
    views["b300-b"] = _view("b300-b", signals=full, inflight=7)  # one ahead: ~0.3 s
    # Its engine queues 30 behind 64 running: 31 ahead x 20 s / 64 slots ~ 9.7 s before this one
    # starts; within the balance thresholds (94 is not 1.5 x 64), so only the SLO moves it.
    queued = LoadSignals(running=64, waiting=30, slots_total=64, scraped_at=1000.0)
    views["b300-a"] = _view("b300-a", signals=queued, inflight=8)
    decision = _decide({"b300-a": PROMPT - 2000}, views, slo_ms=10_000.0)
    held = decision.evaluation("b300-a")
    assert held is not None and held.expected_cached_tokens == PROMPT - 2000 and held.meets_ttft is False
    moved = decision.evaluation("b300-b")
    assert moved is not None and moved.meets_ttft is True  # 1 s + 0.3 s + 100k tokens at 12k tokens/s
    assert decision.chosen == "b300-b"
    views["b300-a"] = _view("b300-a", signals=full, inflight=8)  # without the queue it keeps it
    assert _decide({"b300-a": PROMPT - 2000}, views, slo_ms=10_000.0).chosen == "b300-a"


def test_a_long_uncached_prompt_adds_its_prefill_to_the_predicted_ttft() -> None:
    cold = _decide({}, _idle()).evaluation("b300-a")
    warm = _decide({"b300-a": PROMPT - 1000}, _idle()).evaluation("b300-a")
    assert cold is not None and warm is not None and cold.ttft_p95_s is not None
    # The prefill speed is measured over whole TTFTs, so the prefill stands for the whole TTFT.
    assert abs(cold.ttft_p95_s - max(1.0, PROMPT / 12_000.0)) < 1e-9
    assert warm.ttft_p95_s == 1.0


def test_replicas_that_no_cache_tells_apart_go_by_load() -> None:
    views = _idle()
    views["api"] = _view("api", healthy=False)
    # The busy replica's measured throughput is higher, so per token it looks cheaper: load wins.
    views["b300-a"] = _view("b300-a", inflight=5, aggregate_tokens_per_s=4000.0)
    views["b300-b"] = _view("b300-b", inflight=1)
    assert _decide({}, views).chosen == "b300-b"
    views["b300-b"] = _view("b300-b", inflight=9)
    assert _decide({}, views).chosen == "b300-a"
