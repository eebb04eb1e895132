"""The routers of the agent benchmark by name: the gateway's own decision fed by its prefix index, and
the baselines it is compared with (cache_baselines.py, hindsight.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from gateway.measure.prefix_index import FIRST_BOUNDARIES, LAST_BOUNDARIES, PrefixIndex, PromptKeys
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures
from gateway.simulate.baselines import make_router
from gateway.simulate.cache_baselines import CacheAwareLike, SessionSticky
from gateway.simulate.engine import PolicyRouter, Router, policy_router_decide
from gateway.simulate.hindsight import SessionOracle
from gateway.simulate.workload import PromptShape, SimRequest

if TYPE_CHECKING:
    from gateway.simulate.engine import Simulation

GATEWAY = "gateway"

AGENT_BASELINES = ("cache-blind", "session-sticky", "cache-aware-like", "session-oracle")


def make_agent_router(name: str, policy: CompiledPolicy) -> Router:
    factories: dict[str, Callable[[], Router]] = {
        GATEWAY: lambda: GatewayWithIndex(GATEWAY),
        "cache-blind": lambda: PolicyRouter("cache-blind"),
        "session-sticky": SessionSticky,
        "cache-aware-like": CacheAwareLike,
        "session-oracle": SessionOracle,
    }
    if name in factories:
        return factories[name]()
    return make_router(name, policy)


class GatewayWithIndex:
    """The gateway's own decision, fed as the request path feeds it: its ``PrefixIndex`` (the real
    one, in virtual time) says which backends likely hold the prompt's prefix, and is told of every
    answer with the cached tokens the backend reported. Its TTL and capacity per backend are the
    policy's (``backends.<name>.prefix_cache``), read as the runtime reads them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.index: PrefixIndex | None = None

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        req = sim.current_request
        if self.index is None:
            backends = sim.policy.backends
            self.index = PrefixIndex(
                lambda b: backends[b].prefix_cache_ttl_s, lambda b: backends[b].prefix_cache_capacity_tokens
            )
        if req is not None and req.shape is not None:
            keys = gateway_keys(req.shape)
            cached = self.index.expected_cached_many(route.backends, keys, sim.timeline.now)
            if cached:
                features = replace(features, cached_tokens=cached)
        return policy_router_decide(sim, features, route)

    def answered(self, req: SimRequest, backend: str, cached_tokens: int, now: float) -> None:
        if req.shape is not None and self.index is not None:
            self.index.record(backend, gateway_keys(req.shape), now, cached_tokens)


def gateway_keys(shape: PromptShape) -> PromptKeys:
    """The keys the request path would make of this prompt: message ends, only the first few and the
    last few (prefix_index.prompt_keys keeps no more)."""
    ends, hashes = shape
    if len(ends) > FIRST_BOUNDARIES + LAST_BOUNDARIES:
        ends = ends[:FIRST_BOUNDARIES] + ends[-LAST_BOUNDARIES:]
        hashes = hashes[:FIRST_BOUNDARIES] + hashes[-LAST_BOUNDARIES:]
    return PromptKeys(ends, hashes)
