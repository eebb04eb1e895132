"""The routing decision: which backends can serve a request within its route's SLO, at what cost, and why.

A pure function of (request features, route, policy, stats snapshot, rng): a simulator can drive it
in virtual time, and /admin/explain can show every number it weighed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, NamedTuple

from gateway.costs import effective_usd_per_mtok, expected_cost, predict_output_tokens
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.schema import Objective, Slo
from gateway.stats import BackendView

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


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    route: str
    prompt_tokens: int  # estimated before sending
    max_tokens: int | None = None
    stream: bool = False


class CandidateEval(NamedTuple):
    """One candidate as the decision saw it; predictions are None where nothing is measured yet.

    A tuple, built positionally: the decision makes one per candidate per request, and the
    ``why`` strings are only formatted when someone reads them (/admin/explain, logs).
    """

    backend: str
    eligible: bool  # circuit lets requests through, healthy, not booting, below max concurrency
    measured: bool
    feasible: bool  # no SLO field predicted to be missed (unmeasured: feasible but unknown)
    ttft_p95_s: float | None  # measured p95 plus predicted queueing
    first_answer_p95_s: float | None
    decode_tokens_per_s: float | None
    queue_wait_s: float
    usd_per_mtok_out: float | None
    expected_cost_usd: float | None
    predicted_output_tokens: float
    marginal_headroom: bool  # the pool can take this request without breaking the SLO
    meets_ttft: bool | None  # None: the SLO does not ask, or nothing is measured
    meets_decode: bool | None
    meets_first_answer: bool | None
    samples: int
    last_sample_at: float | None
    blocked_by: tuple[str, ...]  # why it is not eligible, e.g. "circuit open"
    slo: Slo

    @property
    def why(self) -> tuple[str, ...]:
        """Everything that holds this candidate back, e.g. "ttft p95 4.2s > slo 3.0s", "unmeasured"."""
        reasons = list(self.blocked_by)
        slo = self.slo
        if self.meets_ttft is False and self.ttft_p95_s is not None and slo.ttft_p95_ms is not None:
            reasons.append(f"ttft p95 {_seconds(self.ttft_p95_s)} > slo {_seconds(slo.ttft_p95_ms / 1000)}")
        if self.meets_decode is False and self.decode_tokens_per_s is not None:
            reasons.append(
                f"decode {self.decode_tokens_per_s:.1f} tok/s < slo {slo.min_decode_tokens_per_s:.1f} tok/s"
            )
        fa, fa_slo = self.first_answer_p95_s, slo.first_answer_p95_ms
        if self.meets_first_answer is False and fa is not None and fa_slo is not None:
            reasons.append(f"first answer p95 {_seconds(fa)} > slo {_seconds(fa_slo / 1000)}")
        if not self.measured:
            reasons.append("unmeasured")
        return tuple(reasons)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for /admin/explain."""
        fields = self._asdict()
        del fields["slo"], fields["blocked_by"]
        fields["why"] = list(self.why)
        return fields


@dataclass(frozen=True, slots=True)
class Decision:
    order: tuple[str, ...]  # the chosen backend first, then fallbacks in preference order
    reason: Reason
    evals: tuple[CandidateEval, ...]

    @property
    def chosen(self) -> str | None:
        return self.order[0] if self.order else None


def decide(
    req: RequestFeatures,
    route: CompiledRoute,
    policy: CompiledPolicy,
    snapshot: Mapping[str, BackendView],
    rng: random.Random,
) -> Decision:
    backends = policy.backends
    evals = tuple(
        evaluate(req, backends[name], snapshot.get(name) or BackendView(name), route.slo)
        for name in route.backends
    )
    eligible = [e for e in evals if e.eligible]
    if not eligible:
        return Decision((), "no_healthy_backend", evals)
    order, reason = _rank(eligible, route)
    order, reason = _maybe_explore(eligible, order, reason, route, rng)
    return Decision(tuple(e.backend for e in order[: route.fallback.max_attempts]), reason, evals)


def _rank(eligible: list[CandidateEval], route: CompiledRoute) -> tuple[list[CandidateEval], Reason]:
    rank_key = _RANK_KEYS[route.objective]
    within = sorted((e for e in eligible if e.measured and e.feasible), key=rank_key)
    unmeasured = sorted((e for e in eligible if not e.measured), key=rank_key)
    infeasible = [e for e in eligible if e.measured and not e.feasible]
    if route.when_infeasible == "reject":
        # Fallbacks never leave the SLO either: the route asked for no answer rather than a late one.
        tail: list[CandidateEval] = []
    else:
        infeasible_key = _by_cost if route.when_infeasible == "cheapest" else _by_ttft
        tail = sorted(infeasible, key=infeasible_key)
    single = len(route.backends) == 1
    if within:
        return within + unmeasured + tail, "only_candidate" if single else WITHIN_SLO_REASONS[route.objective]
    if unmeasured:
        return unmeasured + tail, "only_candidate" if single else "unmeasured_candidate"
    if route.when_infeasible == "reject":
        return [], "rejected_no_feasible"
    return tail, "no_feasible_cheapest" if route.when_infeasible == "cheapest" else "no_feasible_fastest"


def _maybe_explore(
    eligible: list[CandidateEval],
    order: list[CandidateEval],
    reason: Reason,
    route: CompiledRoute,
    rng: random.Random,
) -> tuple[list[CandidateEval], Reason]:
    """Now and then send a request to a candidate the policy avoids, so its measurements stay fresh.

    Rejecting routes explore too: otherwise a route whose every backend once looked slow would
    reject forever, with nothing left to show that a backend recovered.
    """
    if route.exploration <= 0:
        return order, reason
    chosen = order[0].backend if order else None
    others = [e for e in eligible if e.backend != chosen]
    if not others or rng.random() >= route.exploration:
        return order, reason
    pick = min(others, key=_staleness)
    return [pick, *(e for e in order if e is not pick)], "exploration"


def evaluate(req: RequestFeatures, backend: CompiledBackend, view: BackendView, slo: Slo) -> CandidateEval:
    """Predict how ``backend`` would serve ``req`` now and whether that meets ``slo``."""
    blocked_by = _blocked_by(req, backend, view)
    queued_ahead, queue_wait = predict_queue(backend, view)
    ttft = None if view.ttft_p95_s is None else view.ttft_p95_s + queue_wait
    first_answer = None if view.first_answer_p95_s is None else view.first_answer_p95_s + queue_wait
    decode = view.decode_tokens_per_s
    meets_ttft = _within(ttft, slo.ttft_p95_ms)
    meets_first_answer = _within(first_answer, slo.first_answer_p95_ms)
    min_decode = slo.min_decode_tokens_per_s
    meets_decode = None if min_decode is None or decode is None else decode >= min_decode
    feasible = meets_ttft is not False and meets_decode is not False and meets_first_answer is not False
    eligible = not blocked_by
    # Headroom is judged on what is known: unmeasured counts as feasible until traffic says otherwise.
    headroom = eligible and feasible and queued_ahead == 0
    learned = view.completion_tokens_by_route.get(req.route)
    predicted_output = predict_output_tokens(backend.thinking, learned, req.max_tokens)
    return CandidateEval(
        backend.name,
        eligible,
        view.samples > 0,
        feasible,
        ttft,
        first_answer,
        decode,
        queue_wait,
        effective_usd_per_mtok(backend, view.aggregate_tokens_per_s),
        expected_cost(backend, view, req.prompt_tokens, predicted_output, headroom),
        predicted_output,
        headroom,
        meets_ttft,
        meets_decode,
        meets_first_answer,
        view.samples,
        view.last_sample_at,
        blocked_by,
        slo,
    )


def predict_queue(backend: CompiledBackend, view: BackendView) -> tuple[int, float]:
    """Requests that would be ahead of this one, and the seconds they would add to its TTFT.

    Capacity is the server's slot count when it reports one, else the policy's max concurrency;
    queued requests drain at about ``capacity`` per mean service time.
    """
    signals = view.signals
    capacity = backend.max_concurrency
    occupied = view.inflight
    waiting = 0
    if signals is not None:
        if signals.slots_total:
            capacity = signals.slots_total
        waiting = int(signals.waiting or 0)
        occupied = max(occupied, int(signals.running or 0) + waiting)
    # A server already queueing puts this request behind its queue, whatever the policy allows.
    ahead = max(occupied + 1 - capacity, waiting + 1 if waiting else 0, 0)
    if ahead == 0 or view.service_time_s is None:
        return ahead, 0.0
    return ahead, ahead * view.service_time_s / capacity


def _blocked_by(req: RequestFeatures, backend: CompiledBackend, view: BackendView) -> tuple[str, ...]:
    window = backend.context_window
    if (
        view.healthy
        and not view.booting
        and view.accepts_requests
        and view.inflight < backend.max_concurrency
        and (window is None or req.prompt_tokens <= window)
    ):
        return ()  # the common case, kept free of string formatting
    blocked = []
    if view.booting or not view.healthy:
        blocked.append("booting" if view.booting else "unhealthy")
    if not view.accepts_requests:
        blocked.append("circuit open" if view.circuit == "open" else "circuit half_open, probe in flight")
    if view.inflight >= backend.max_concurrency:
        blocked.append(f"at max concurrency {backend.max_concurrency}")
    if backend.context_window is not None and req.prompt_tokens > backend.context_window:
        blocked.append(f"prompt ~{req.prompt_tokens} tokens > context window {backend.context_window}")
    return tuple(blocked)


def _within(predicted_s: float | None, slo_ms: float | None) -> bool | None:
    if slo_ms is None or predicted_s is None:
        return None
    return predicted_s * 1000.0 <= slo_ms


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value >= 1.0 else f"{value * 1000.0:.0f}ms"


def _known(value: float | None) -> float:
    return math.inf if value is None else value


def _by_cost(e: CandidateEval) -> tuple[float, float]:
    return _known(e.expected_cost_usd), _known(e.ttft_p95_s)


def _by_ttft(e: CandidateEval) -> tuple[float, float]:
    return _known(e.ttft_p95_s), _known(e.expected_cost_usd)


def _by_throughput(e: CandidateEval) -> tuple[float, float]:
    tps = e.decode_tokens_per_s
    return -tps if tps is not None else math.inf, _known(e.expected_cost_usd)


def _staleness(e: CandidateEval) -> tuple[bool, float]:
    """Unmeasured first, then least recently measured: avoided candidates take turns. (Fewest samples
    would starve all but the slowest backend, which gathers samples slowest.)"""
    return e.measured, -math.inf if e.last_sample_at is None else e.last_sample_at


_RANK_KEYS: Mapping[Objective, Callable[[CandidateEval], tuple[float, float]]] = MappingProxyType(
    {"lowest_cost": _by_cost, "lowest_ttft": _by_ttft, "highest_throughput": _by_throughput}
)
