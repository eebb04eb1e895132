"""Routers for agent traffic to compare the gateway's cache-aware decision against.

- ``cache-blind``: today's gateway, ``decide`` without ``cached_tokens``: every prompt priced and
  predicted as if nothing were cached.
- ``session-sticky``: a consistent (rendezvous) hash of the session over the route's healthy
  backends (nginx ``hash $session consistent``, SMG ``consistent_hashing``); the next in hash order
  are the fallbacks.
- ``cache-aware-like``: the SGLang Model Gateway's ``cache_aware`` policy as documented: a per-worker
  tree of the prompts it routed there (inserted at routing time, never told of evictions); if the load
  is imbalanced (in flight: max - min > ``balance_abs_threshold`` 64 and max > 1.5 x min) the least
  loaded worker; else the worker with the longest prefix match if its match ratio exceeds
  ``cache_threshold`` 0.3, else the least loaded.
- ``session-oracle`` (hindsight.py): every session placed once, knowing all sessions' futures.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures
from gateway.simulate.baselines import _decision, _open
from gateway.simulate.workload import SimRequest

if TYPE_CHECKING:
    from gateway.simulate.engine import Simulation

CACHE_THRESHOLD = 0.3  # SMG defaults (docs/concepts/routing/cache-aware.md)
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


def healthy(sim: Simulation, names: Sequence[str]) -> list[str]:
    """The backends whose circuit lets a request through and that the health checks call healthy."""
    return [n for n in _open(sim, names) if sim.stats.view(n).healthy]


def session_of(sim: Simulation) -> SimRequest | None:
    """The request being decided (routers see only its features; the engine sets this)."""
    return sim.current_request


class SessionSticky:
    name = "session-sticky"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        req = session_of(sim)
        session = -1 if req is None else req.session
        names = healthy(sim, route.backends)
        names.sort(key=lambda n: zlib.crc32(f"{session}/{n}".encode()), reverse=True)
        return _decision(sim, features, route, names)


class CacheAwareLike:
    name = "cache-aware-like"

    def __init__(self) -> None:
        self._trees: dict[str, set[int]] = {}  # worker -> message hashes routed there

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = healthy(sim, route.backends)
        if not names:
            return _decision(sim, features, route, [])
        load = {n: sim.stats.local_inflight(n) for n in names}
        least = sorted(names, key=lambda n: load[n])  # stable: route order breaks ties
        req = session_of(sim)
        most, fewest = max(load.values()), min(load.values())
        imbalanced = most - fewest > BALANCE_ABS_THRESHOLD and most > BALANCE_REL_THRESHOLD * fewest
        if imbalanced or req is None or req.shape is None:
            return _decision(sim, features, route, least)
        ends, hashes = req.shape
        matched = {n: self._match(n, ends, hashes) for n in names}
        best = max(names, key=lambda n: matched[n])  # first among equals: route order
        pick = best if matched[best] / max(1, req.prompt_tokens) > CACHE_THRESHOLD else least[0]
        self._trees.setdefault(pick, set()).update(hashes)  # inserted when routed
        return _decision(sim, features, route, [pick, *(n for n in least if n != pick)])

    def _match(self, name: str, ends: Sequence[int], hashes: Sequence[int]) -> int:
        tree = self._trees.get(name, set())
        matched = 0
        for end, key in zip(ends, hashes, strict=True):
            if key not in tree:
                break
            matched = end
        return matched
