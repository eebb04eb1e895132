"""The routers of the agent benchmark by name: the gateway's own decision fed by its prefix index, and
the baselines it is compared with (cache_baselines.py, hindsight.py)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.policy.compiled import CompiledPolicy
from gateway.simulate.baselines import make_router
from gateway.simulate.cache_baselines import CacheAwareLike, SessionSticky
from gateway.simulate.engine import PolicyRouter, Router
from gateway.simulate.hindsight import SessionOracle

AGENT_BASELINES = ("cache-blind", "session-sticky", "cache-aware-like", "session-oracle")


def make_agent_router(name: str, policy: CompiledPolicy) -> Router:
    factories: dict[str, Callable[[], Router]] = {
        "cache-blind": lambda: PolicyRouter("cache-blind"),
        "session-sticky": SessionSticky,
        "cache-aware-like": CacheAwareLike,
        "session-oracle": SessionOracle,
    }
    if name in factories:
        return factories[name]()
    return make_router(name, policy)
