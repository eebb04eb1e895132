"""The routing decision: which backends can serve a request within its route's SLO, at what cost, and why.

A pure function of (request features, route, policy, stats snapshot, rng): a simulator can drive it
in virtual time, and /admin/explain can show every number it weighed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from gateway.measure.backend_stats import PREFILL_MIN_TOKENS, BackendView
from gateway.money.costs import cached_discount, expected_cost
from gateway.policy.affinity import by_load_groups, load_share
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.evaluate import (
    EMPTY_MAPPING,
    CandidateEval,
    RequestFeatures,
    Standing,
    evaluate,
    evaluation,
    feasible_with_prefill,
    predict_queue,
    standing_of,
    uncached_prefill_s,
)
from gateway.policy.schema import Objective

__all__ = [
    "CandidateEval",
    "Decision",
    "DecisionMemo",
    "RequestFeatures",
    "decide",
    "evaluate",
    "predict_queue",
]

Reason = Literal[
    "cheapest_within_slo",
    "fastest_within_slo",
    "highest_throughput_within_slo",
    "only_candidate",
    "unmeasured_candidate",
    "no_feasible_fastest",
    "no_feasible_cheapest",
    "rejected_no_feasible",
    "no_healthy_backend",
    "exploration",
]

WITHIN_SLO_REASONS: Mapping[Objective, Reason] = MappingProxyType(
    {
        "lowest_cost": "cheapest_within_slo",
        "lowest_ttft": "fastest_within_slo",
        "highest_throughput": "highest_throughput_within_slo",
    }
)


# What a decision remembers between requests: per (backend, route), the view its standing was
# computed from. Owned by the caller (the Runtime), so ``decide`` stays a function of its inputs.
DecisionMemo = dict[tuple[str, str], tuple[BackendView, CompiledBackend, Standing]]


class Decision:
    """The chosen order and its reason; the per-candidate evaluations are built only when read
    (``/admin/explain``, budgets), since most requests need just the order."""

    __slots__ = ("_build", "_evals", "cached_tokens", "expected_cost_usd", "order", "reason")

    def __init__(
        self,
        order: tuple[str, ...],
        reason: Reason,
        evals: tuple[CandidateEval, ...] | Callable[[], tuple[CandidateEval, ...]],
        expected_cost_usd: float | None = None,
        cached_tokens: Mapping[str, int] = EMPTY_MAPPING,
    ) -> None:
        self.order = order  # the chosen backend first, then fallbacks in preference order
        self.reason = reason
        self.expected_cost_usd = expected_cost_usd  # of the chosen backend
        # The cached prompt tokens the decision counted on per backend (after the balance guard).
        self.cached_tokens = cached_tokens
        if callable(evals):
            self._build: Callable[[], tuple[CandidateEval, ...]] | None = evals
            self._evals: tuple[CandidateEval, ...] | None = None
        else:
            self._build, self._evals = None, evals

    @property
    def evals(self) -> tuple[CandidateEval, ...]:
        if self._evals is None:
            assert self._build is not None
            self._evals, self._build = self._build(), None
        return self._evals

    @property
    def chosen(self) -> str | None:
        return self.order[0] if self.order else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (self.order, self.reason, self.evals) == (other.order, other.reason, other.evals)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Decision(order={self.order!r}, reason={self.reason!r})"

    def evaluation(self, backend: str) -> CandidateEval | None:
        return next((e for e in self.evals if e.backend == backend), None)


def decide(
    req: RequestFeatures,
    route: CompiledRoute,
    policy: CompiledPolicy,
    snapshot: Mapping[str, BackendView],
    rng: random.Random,
    memo: DecisionMemo | None = None,
) -> Decision:
    """Rank the route's eligible candidates: measured within the SLO by the objective, then the
    unmeasured that the policy declares within it (``expected_ttft_ms``), then the unknown, then (unless
    the route rejects) the measured or declared infeasible by ``when_infeasible``; maybe explore.

    Each candidate becomes one plain sort key, ``(class, primary, secondary, index)``, so ranking is
    a C-speed sort of tuples; the index keeps route order among equals.

    Cache-aware: ``req.cached_tokens`` takes the cached part of the prompt off each candidate's cost
    (cached-input price, or a pool's skipped prefill), and a long uncached part adds its prefill to the
    predicted TTFT. Among replicas of one pool (``policy.affinity``), a prompt whose cache only one of
    them holds stays there unless that replica's load is out of balance; otherwise they go by load.
    """
    backends = policy.backends
    memo = {} if memo is None else memo
    slo, names, objective = route.slo, route.backends, route.objective
    reject = route.when_infeasible == "reject"
    infeasible_by_cost = route.when_infeasible == "cheapest"
    prompt, max_tokens = req.prompt_tokens, req.max_tokens
    cached_map = req.cached_tokens
    by_load: tuple[tuple[int, ...], ...] = ()
    if route.replica_groups:
        cached_map, by_load = by_load_groups(
            prompt, names, route.replica_groups, backends, snapshot, cached_map
        )
        if cached_map is not req.cached_tokens:
            req = RequestFeatures(req.route, prompt, max_tokens, req.stream, cached_map)
    long_prompt = prompt >= PREFILL_MIN_TOKENS
    # Looked at once: the empty default's truthiness is a Python-level __len__, ~80 ns per candidate.
    held = dict(cached_map) if cached_map else None
    rows: list[tuple[CompiledBackend, BackendView, Standing]] = []
    eligible: list[int] = []
    keys: list[tuple[int, float, float, int]] = []
    costs: list[float] = []
    for index, name in enumerate(names):
        backend = backends[name]
        view = snapshot.get(name) or BackendView(name)
        known = memo.get((name, route.name))
        if known is not None and known[0] is view and known[1] is backend:
            standing = known[2]
        else:
            standing = standing_of(backend, view, slo, route.name, route.admit_beyond_max_concurrency)
            memo[(name, route.name)] = (view, backend, standing)
        rows.append((backend, view, standing))
        predicted = standing.default_output_tokens
        if max_tokens is not None and predicted > max_tokens:
            predicted = float(max_tokens)
        expected = expected_cost(standing.rates, prompt, predicted)
        cached = 0
        if held is not None:
            cached = held.get(name, 0)
            if cached and expected is not None:
                expected -= cached_discount(backend, standing.rates, min(cached, prompt))
        cost = math.inf if expected is None else expected
        costs.append(cost)
        window = backend.context_window
        if standing.blocked_by or (window is not None and prompt > window):
            continue
        eligible.append(index)
        ttft = math.inf if standing.ttft_p95_s is None else standing.ttft_p95_s
        feasible = standing.feasible
        if long_prompt and (prefill := uncached_prefill_s(backend, view, prompt, cached)):
            ttft = max(ttft, standing.queue_wait_s + prefill)  # see evaluation(): a whole TTFT
            feasible = feasible_with_prefill(standing, slo, prefill)
        if not feasible:  # measured or declared outside the SLO
            if not reject:
                keys.append((3, cost, ttft, index) if infeasible_by_cost else (3, ttft, cost, index))
            continue
        rank = 0 if standing.measured else 1 if standing.declared else 2
        if objective == "lowest_cost":
            keys.append((rank, cost, ttft, index))
        elif objective == "lowest_ttft":
            keys.append((rank, ttft, cost, index))
        else:
            decode = standing.decode_tokens_per_s
            keys.append((rank, -decode if decode is not None else math.inf, cost, index))

    def build_evals() -> tuple[CandidateEval, ...]:
        return tuple(evaluation(req, backend, view, slo, standing) for backend, view, standing in rows)

    if not eligible:
        return Decision((), "no_healthy_backend", build_evals, None, cached_map)
    if by_load and objective == "lowest_cost":
        keys = _by_load(keys, by_load, costs, rows, names)
    keys.sort()
    order = [key[3] for key in keys[: route.fallback.max_attempts]]
    reason = _reason(keys[0][0] if keys else None, route)
    # A route with an SLO never explores with users' requests: probes keep its stats fresh.
    if route.exploration > 0 and not route.has_slo:
        others = [i for i in eligible if not order or i != order[0]]
        if others and rng.random() < route.exploration:
            # Unmeasured first, then the least recently measured: avoided candidates take turns.
            # (Fewest samples would starve all but the slowest backend, which gathers samples slowest.)
            pick = min(others, key=lambda i: _staleness(rows[i][2]))
            order = [pick, *(i for i in order if i != pick)]
            reason = "exploration"
    order = order[: route.fallback.max_attempts]
    chosen_cost = costs[order[0]] if order else math.inf
    return Decision(
        tuple(names[i] for i in order),
        reason,
        build_evals,
        None if chosen_cost == math.inf else chosen_cost,
        cached_map,
    )


def _by_load(
    keys: list[tuple[int, float, float, int]],
    groups: tuple[tuple[int, ...], ...],
    costs: list[float],
    rows: list[tuple[CompiledBackend, BackendView, Standing]],
    names: tuple[str, ...],
) -> list[tuple[int, float, float, int]]:
    """Replicas of one pool that no cache tells apart cost the same (their cheapest), and the least
    loaded goes first: a busy replica's higher throughput makes it look cheaper per token, which would
    pile every new conversation onto it."""
    group_of = {i: members for members in groups for i in members}
    cheapest = {members: min(costs[i] for i in members) for members in groups}
    changed = []
    for rank, primary, secondary, index in keys:
        members = group_of.get(index)
        if members is None or rank == 3:  # outside the SLO: ranked by its own terms
            changed.append((rank, primary, secondary, index))
        else:
            backend, view, _ = rows[index]
            changed.append((rank, cheapest[members], load_share(backend, view), index))
    return changed


def _reason(best_rank: int | None, route: CompiledRoute) -> Reason:
    single = len(route.backends) == 1
    if best_rank == 0:
        return "only_candidate" if single else WITHIN_SLO_REASONS[route.objective]
    if best_rank in (1, 2):
        return "only_candidate" if single else "unmeasured_candidate"
    if best_rank is None:
        return "rejected_no_feasible"
    return "no_feasible_cheapest" if route.when_infeasible == "cheapest" else "no_feasible_fastest"


def _staleness(standing: Standing) -> tuple[bool, float]:
    return standing.measured, -math.inf if standing.last_sample_at is None else standing.last_sample_at
