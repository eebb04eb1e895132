"""Agent sessions in the simulator: the prefix caches, the workload's shape, and the must-show ordering
of costs (bench/workloads/agents.yaml, seeded; virtual time only)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from bench.agents import workload
from gateway.emulator.profiles import PROFILES
from gateway.policy.load import load_policy
from gateway.simulate.agent_routers import GATEWAY, make_agent_router
from gateway.simulate.caches import LruKvCache, TtlCache, cache_for
from gateway.simulate.engine import Simulation
from gateway.simulate.report import summarize


def test_a_replicas_lru_evicts_the_least_recently_used_conversation_tail_first() -> None:
    cache = LruKvCache(capacity_tokens=250, block_tokens=1)
    shared = (100, 1)
    a = ((shared[0], 150), (shared[1], 11))
    b = ((shared[0], 250), (shared[1], 21))
    assert cache.serve(a, 151, now=0.0) == 0
    assert cache.serve(a, 151, now=1.0) == 150  # all of it held (never the last token's worth more)
    assert cache.serve(b, 251, now=2.0) == 100  # the shared prefix only; a's tail is evicted for b's
    assert cache.holds(1) and not cache.holds(11) and cache.used_tokens == 250
    assert cache.serve(a, 151, now=3.0) == 100


def test_the_paid_apis_cache_forgets_a_prefix_five_minutes_after_its_last_use() -> None:
    cache = TtlCache(ttl_s=300.0, block_tokens=128)
    shape = ((2000, 5000), (1, 2))
    assert cache.serve(shape, 5001, now=0.0) == 0
    assert cache.serve(shape, 5001, now=299.0) == 5000 - 5000 % 128  # whole blocks only
    assert cache.serve(shape, 5001, now=598.0) == 4992  # used at 299 s: still held
    assert cache.serve(shape, 5001, now=899.0) == 0


def test_every_backend_kind_gets_its_cache() -> None:
    assert isinstance(cache_for(PROFILES["b300-vllm"]), LruKvCache)
    assert isinstance(cache_for(PROFILES["paid-api"]), TtlCache)


def test_sessions_grow_from_the_shared_prefix_and_each_turn_extends_the_last() -> None:
    work = workload()
    sessions: dict[int, list[Any]] = {}
    for req in work.requests:
        sessions.setdefault(req.session, []).append(req)
    assert len(sessions) == 24
    firsts = [turns[0] for turns in sessions.values()]
    assert all(r.shape is not None and r.shape[0][0] == 16_000 for r in firsts)
    assert 18_000 < sorted(r.prompt_tokens for r in firsts)[12] < 25_000
    assert max(r.prompt_tokens for r in work.requests) <= 300_000
    for turns in sessions.values():
        for before, after in itertools.pairwise(turns):
            assert before.shape is not None and after.shape is not None
            assert after.shape[1][: len(before.shape[1])] == before.shape[1]  # the previous prompt, extended
            assert after.at > before.at


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    import os

    from bench.agents import PAID_KEY, policy_text

    os.environ["AGENTS_PAID_KEY"] = PAID_KEY
    path = Path(tmp_path_factory.mktemp("agents")) / "policy.yaml"
    path.write_text(
        policy_text({n: f"http://127.0.0.1:9/{n}" for n in ("b300-a", "b300-b", "paid-api")}, 1.0)
    )
    policy = load_policy(path)
    work = workload()
    names = (GATEWAY, "cache-blind", "session-sticky", "cache-aware-like", "session-oracle")
    return {
        name: summarize(Simulation(policy, work, make_agent_router(name, policy), seed=7).run())
        for name in names
    }


def test_the_gateway_beats_cache_blind_routing_on_cost_at_equal_or_better_slo(rows: dict[str, Any]) -> None:
    gateway, blind = rows[GATEWAY], rows["cache-blind"]
    assert gateway["total_cost_usd"] < blind["total_cost_usd"]
    assert gateway["slo_attainment"] >= blind["slo_attainment"]


def test_the_gateway_beats_sticky_and_cache_aware_and_lands_within_5_percent_of_the_oracle(
    rows: dict[str, Any],
) -> None:
    cost = {name: row["total_cost_usd"] for name, row in rows.items()}
    assert cost[GATEWAY] <= cost["session-sticky"]
    assert cost[GATEWAY] <= cost["cache-aware-like"]
    assert cost[GATEWAY] <= 1.05 * cost["session-oracle"]
    assert rows[GATEWAY]["cache_hit_rate"] > 0.8  # it keeps conversations where their cache is


def test_sessions_of_other_keys_share_no_prefix_under_per_key_isolation() -> None:
    """``keys``: session i uses key i % keys; the system prompt every session sends is one prefix per
    key (as an engine hashes a salted first block apart), and nothing else is shared either way."""
    shared = {r.session: r.shape[1][0] for r in workload(sessions=8).requests if r.shape is not None}
    assert len(set(shared.values())) == 1
    isolated = {
        r.session: r.shape[1][0] for r in workload(sessions=8, keys=4).requests if r.shape is not None
    }
    assert len(set(isolated.values())) == 4
    assert all(isolated[s] == isolated[s % 4] for s in isolated)
