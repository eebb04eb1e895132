"""Routers to compare a policy against, each after its documented behaviour, and the hindsight oracle.

- ``round-robin``: backends in turn (nginx/Envoy's default); ``shuffle``: a uniform random pick,
  LiteLLM's default "simple-shuffle" without weights.
- ``least-busy``: fewest requests in flight (LiteLLM "least-busy", Envoy "least request").
- ``lowest-latency``: lowest mean TTFT of the last ten successes; unmeasured first (LiteLLM
  "latency-based-routing").
- ``lowest-price``: cheapest list price per output token (LiteLLM "cost-based-routing"); a GPU-hour
  pool's list price is its hourly price at its assumed throughput.
- ``all-to-<backend>``: every request to one backend, no fallback.
- ``oracle``: with hindsight (true queue and seats of every pool, each request's length), fill the
  pools while the request's TTFT and decode speed stay within the SLO, spill the rest to the API.

All but ``all-to-*`` skip a backend whose circuit is open, as the cooldowns of those routers do.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from gateway.money.costs import per_mtok, pool_usd_per_token
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.decide import CandidateEval, Decision, Reason, RequestFeatures, decide
from gateway.simulate.engine import Router

if TYPE_CHECKING:
    from gateway.simulate.engine import Simulation

LATENCY_WINDOW = 10  # LiteLLM's latency router averages the last ten


def _decision(
    sim: Simulation, features: RequestFeatures, route: CompiledRoute, order: Sequence[str]
) -> Decision:
    """A baseline's order, with the gateway's evaluations for budget reservations (built if read)."""

    def evals() -> tuple[CandidateEval, ...]:
        snapshot = sim.stats.snapshot(route.backends)
        return decide(features, route, sim.policy, snapshot, sim.rng).evals

    return Decision(tuple(order), cast("Reason", "baseline"), evals)


def _open(sim: Simulation, names: Sequence[str]) -> list[str]:
    return [n for n in names if sim.stats.allows_request(n)]


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = route.backends
        start = self._next.get(route.name, 0)
        self._next[route.name] = (start + 1) % len(names)
        return _decision(sim, features, route, _open(sim, [*names[start:], *names[:start]]))


class Shuffle:
    name = "shuffle"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = list(route.backends)
        sim.rng.shuffle(names)
        return _decision(sim, features, route, _open(sim, names))


class LeastBusy:
    name = "least-busy"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = sorted(route.backends, key=sim.stats.local_inflight)  # stable: route order breaks ties
        return _decision(sim, features, route, _open(sim, names))


class LowestLatency:
    name = "lowest-latency"

    def __init__(self) -> None:
        self._recent: dict[str, deque[float]] = {}

    def observe(self, backend: str, ttft_s: float) -> None:
        recent = self._recent.get(backend)
        if recent is None:
            recent = self._recent[backend] = deque(maxlen=LATENCY_WINDOW)
        recent.append(ttft_s)

    def mean_ttft(self, backend: str) -> float:
        recent = self._recent.get(backend)
        return -math.inf if not recent else sum(recent) / len(recent)

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = sorted(route.backends, key=self.mean_ttft)
        return _decision(sim, features, route, _open(sim, names))


def list_usd_per_mtok(backend: CompiledBackend) -> float:
    if backend.token_prices is not None:
        return per_mtok(backend.token_prices.output)
    pool = backend.pool_price
    if pool is None or pool.assumed_tokens_per_s is None:
        return math.inf
    return per_mtok(pool_usd_per_token(pool.usd_per_hour, pool.assumed_tokens_per_s))


class LowestPrice:
    name = "lowest-price"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        names = sorted(route.backends, key=lambda n: list_usd_per_mtok(sim.policy.backends[n]))
        return _decision(sim, features, route, _open(sim, names))


class AllTo:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.name = f"all-to-{backend}"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        return _decision(sim, features, route, [self.backend])


class Oracle:
    """Hindsight: it sees each pool's true seats, queue and speed, and each request's prompt length."""

    name = "oracle"

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        policy = sim.policy
        pools = [n for n in route.backends if policy.backends[n].pool_price is not None]
        paid = sorted(
            (n for n in route.backends if policy.backends[n].pool_price is None),
            key=lambda n: list_usd_per_mtok(policy.backends[n]),
        )
        fits = [n for n in pools if self.pool_fits(sim, n, features, route)]
        spill = [n for n in paid if sim.models[n].healthy]
        rest = [n for n in pools if n not in fits and sim.models[n].healthy]
        return _decision(sim, features, route, [*fits, *spill, *rest])

    @staticmethod
    def pool_fits(sim: Simulation, name: str, features: RequestFeatures, route: CompiledRoute) -> bool:
        model = sim.models[name]
        if not model.healthy:
            return False
        slo = route.slo
        if slo.ttft_p95_ms is None and slo.min_decode_tokens_per_s is None:
            return True  # no SLO to keep: the paid-for pool takes it, queue or not
        limit = model.profile.max_running
        running = len(model.running)
        if model.waiting or (limit is not None and running >= limit):
            return False  # it would queue behind others
        profile = model.profile
        worst_ttft = profile.ttft_max_s + min(
            profile.prefill_cap_s, features.prompt_tokens * profile.prefill_s_per_token
        )
        if slo.ttft_p95_ms is not None and (worst_ttft + model.added_ttft_s) * 1000.0 > slo.ttft_p95_ms:
            return False
        decode = profile.per_stream_tokens_per_s(running + 1) / model.slowdown
        return slo.min_decode_tokens_per_s is None or decode >= slo.min_decode_tokens_per_s


def baseline_names(policy: CompiledPolicy) -> list[str]:
    fixed = ["round-robin", "shuffle", "least-busy", "lowest-latency", "lowest-price", "oracle"]
    return fixed + [f"all-to-{name}" for name in policy.backends]


def make_router(name: str, policy: CompiledPolicy) -> Router:
    factories: dict[str, Callable[[], Router]] = {
        "round-robin": RoundRobin,
        "shuffle": Shuffle,
        "least-busy": LeastBusy,
        "lowest-latency": LowestLatency,
        "lowest-price": LowestPrice,
        "oracle": Oracle,
    }
    if name in factories:
        return factories[name]()
    if name.startswith("all-to-") and name.removeprefix("all-to-") in policy.backends:
        return AllTo(name.removeprefix("all-to-"))
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(baseline_names(policy))}, all")
