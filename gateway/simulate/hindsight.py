"""The hindsight oracle for agent sessions: every session placed once, knowing every session's future.

What it knows that no router can: each session's every turn (arrival, prompt size, output), so each
session's span and the size its conversation will reach; each pool replica's true KV capacity and
seats. It places sessions in order of their first turn, each on the pool replica where, over the
session's whole life, the conversations placed there all stay in the KV cache (the sum of their
final sizes plus the shared prefix fits) and a seat is left for each; among those, the least filled
(the most batching headroom). A session that fits no replica goes to the cheapest paid API, where it
keeps its cache by the TTL. A session never moves, so it misses the cache only on its first turn.

It is an upper bound on what affinity can do, not on everything: it does not re-place sessions when
load shifts, and it counts each session's full span as busy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures
from gateway.simulate.baselines import _decision, list_usd_per_mtok
from gateway.simulate.cache_baselines import healthy, session_of

if TYPE_CHECKING:
    from gateway.simulate.engine import Simulation


class _Span(NamedTuple):
    start: float
    end: float
    peak_tokens: int


class SessionOracle:
    name = "session-oracle"

    def __init__(self) -> None:
        self.placement: dict[int, str] = {}
        self._planned = False

    def plan(self, sim: Simulation, route: CompiledRoute) -> None:
        spans: dict[int, _Span] = {}
        shared = 0
        for req in sim.workload.requests:
            if req.route != route.name or req.session < 0:
                continue
            if req.shape is not None and len(req.shape[0]) > 1:
                shared = max(shared, req.shape[0][0])
            span = spans.get(req.session)
            busy_until = req.at + 60.0  # its last turn's answer
            if span is None:
                spans[req.session] = _Span(req.at, busy_until, req.prompt_tokens)
            else:
                spans[req.session] = _Span(span.start, busy_until, max(span.peak_tokens, req.prompt_tokens))
        policy = sim.policy
        pools = [n for n in route.backends if policy.backends[n].pool_price is not None]
        paid = sorted(
            (n for n in route.backends if policy.backends[n].pool_price is None),
            key=lambda n: list_usd_per_mtok(policy.backends[n]),
        )
        placed: dict[str, list[_Span]] = {n: [] for n in pools}
        for session, span in sorted(spans.items(), key=lambda item: item[1].start):
            fits = []
            for name in pools:
                profile = sim.models[name].profile
                overlapping = [s for s in placed[name] if s.start < span.end and span.start < s.end]
                tokens = shared + sum(s.peak_tokens - shared for s in overlapping) + span.peak_tokens - shared
                seats = profile.max_running
                if tokens <= profile.kv_capacity_tokens and (seats is None or len(overlapping) < seats):
                    fits.append((tokens / profile.kv_capacity_tokens, name))
            if fits:
                name = min(fits)[1]
                placed[name].append(span)
                self.placement[session] = name
            elif paid:
                self.placement[session] = paid[0]
        self._planned = True

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        if not self._planned:
            self.plan(sim, route)
        req = session_of(sim)
        names = healthy(sim, route.backends)
        home = None if req is None else self.placement.get(req.session)
        order = [home, *(n for n in names if n != home)] if home in names else names
        return _decision(sim, features, route, [n for n in order if n is not None])
