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

import bisect
import math
from typing import TYPE_CHECKING, NamedTuple

from gateway.policy.compiled import CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures
from gateway.simulate.baselines import _decision, list_usd_per_mtok
from gateway.simulate.cache_baselines import healthy, session_of

if TYPE_CHECKING:
    from gateway.simulate.engine import Simulation


class _Session(NamedTuple):
    turns: tuple[tuple[float, int, float], ...]  # (arrival, prompt tokens, busy until), in order

    @property
    def start(self) -> float:
        return self.turns[0][0]

    @property
    def end(self) -> float:
        return self.turns[-1][2]

    def tokens_at(self, t: float) -> int:
        """Its conversation's size at ``t``: the latest turn's prompt, 0 outside its life."""
        if t < self.start or t > self.end:
            return 0
        i = bisect.bisect_right(self.turns, t, key=lambda turn: turn[0])
        return self.turns[i - 1][1]

    def busy_at(self, t: float) -> int:
        return sum(1 for at, _, until in self.turns if at <= t < until)


class SessionOracle:
    name = "session-oracle"

    def __init__(self) -> None:
        self.placement: dict[int, str] = {}
        self._planned = False

    def plan(self, sim: Simulation, route: CompiledRoute) -> None:
        policy = sim.policy
        pools = [n for n in route.backends if policy.backends[n].pool_price is not None]
        turns: dict[int, list[tuple[float, int, float]]] = {}
        shared = 0
        last_prompt: dict[int, int] = {}
        typical = sim.models[pools[0]].profile if pools else None
        for req in sim.workload.requests:
            if req.route != route.name or req.session < 0:
                continue
            if req.shape is not None and len(req.shape[0]) > 1:
                shared = max(shared, req.shape[0][0])
            busy = 0.0
            if typical is not None:
                # Busy until its answer ends: the new part's prefill, then its true output at the
                # speed of a half-full replica.
                new = req.prompt_tokens - last_prompt.get(req.session, shared)
                half = typical.per_stream_tokens_per_s((typical.max_running or 2) // 2)
                busy = typical.ttft_max_s + new * typical.prefill_s_per_token + req.output_tokens / half
            last_prompt[req.session] = req.prompt_tokens
            turns.setdefault(req.session, []).append((req.at, req.prompt_tokens, req.at + busy))
        by_start = sorted(turns.items(), key=lambda item: item[1][0][0])
        sessions = [_Session(tuple(t)) for _, t in by_start]
        paid = sorted(
            (n for n in route.backends if policy.backends[n].pool_price is None),
            key=lambda n: list_usd_per_mtok(policy.backends[n]),
        )
        slo_s = route.slo.ttft_p95_ms / 1000.0 if route.slo.ttft_p95_ms is not None else math.inf
        placed: dict[str, list[_Session]] = {n: [] for n in pools}
        for (number, _), session in zip(by_start, sessions, strict=True):
            fits = []
            for name in pools:
                profile = sim.models[name].profile
                first_prefill = (session.turns[0][1] - shared) * profile.prefill_s_per_token
                if profile.ttft_max_s + min(profile.prefill_cap_s, first_prefill) > slo_s:
                    continue
                fill = self._peak_fill(placed[name], session, shared, profile.kv_capacity_tokens,
                                       profile.max_running)  # fmt: skip
                if fill is not None:
                    fits.append((fill, name))
            if fits:
                name = min(fits)[1]
                placed[name].append(session)
                self.placement[number] = name
            elif paid:
                self.placement[number] = paid[0]
        self._planned = True

    @staticmethod
    def _peak_fill(
        others: list[_Session], session: _Session, shared: int, capacity: int, seats: int | None
    ) -> float | None:
        """The fullest the replica's KV cache gets over ``session``'s life with it placed there, or None
        if some moment overflows the cache or the seats."""
        alive = [s for s in others if s.start <= session.end and session.start <= s.end]
        moments = {at for at, _, _ in session.turns}
        moments.update(at for s in alive for at, _, _ in s.turns if session.start <= at <= session.end)
        peak = 0.0
        for t in moments:
            everyone = [*alive, session]
            tokens = shared + sum(max(0, s.tokens_at(t) - shared) for s in everyone)
            if tokens > capacity:
                return None
            if seats is not None and sum(s.busy_at(t) for s in everyone) > seats:
                return None
            peak = max(peak, tokens / capacity)
        return peak

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        if not self._planned:
            self.plan(sim, route)
        req = session_of(sim)
        names = healthy(sim, route.backends)
        home = None if req is None else self.placement.get(req.session)
        order = [home, *(n for n in names if n != home)] if home in names else names
        return _decision(sim, features, route, [n for n in order if n is not None])
