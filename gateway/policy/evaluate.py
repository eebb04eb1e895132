"""One candidate backend judged for one request: predicted TTFT with queueing, decode speed, cost,
feasibility against the route's SLO, and why it is held back. ``decide`` ranks these.

The request-independent part (``Standing``) holds until the stats publish a new view of the backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.measure.backend_stats import PREFILL_MIN_TOKENS, BackendView
from gateway.money.costs import (
    CostRates,
    cached_discount,
    cost_rates,
    effective_usd_per_mtok,
    expected_cost,
    pool_prefill_tokens_per_s,
    predict_output_tokens,
    prior_output_tokens,
)
from gateway.policy.compiled import CompiledBackend
from gateway.policy.schema import Slo


class _Nothing(Mapping[str, int]):
    """The empty mapping as a default: immutable and hashable, so a frozen dataclass may hold it."""

    __slots__ = ()

    def __getitem__(self, key: str) -> int:
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        # Mapping's own get is __getitem__'s KeyError raised and caught: ~1 us, more with cold caches
        # (a trace's record reads the decision's cached tokens through it once per candidate).
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


EMPTY_MAPPING: Mapping[str, int] = _Nothing()


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    route: str
    prompt_tokens: int  # estimated before sending
    max_tokens: int | None = None
    stream: bool = False
    # Expected cached prompt tokens per backend name (gateway.measure.prefix_index), filled by the
    # caller: the runtime from its index, the simulator from the same index in virtual time. A backend
    # not named holds none of this prompt.
    cached_tokens: Mapping[str, int] = EMPTY_MAPPING


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
    declared: bool = False  # unmeasured, judged on the policy's expected_ttft_ms
    expected_cached_tokens: int = 0  # of this prompt, held in the backend's prefix cache
    prefill_s: float = 0.0  # predicted prefill of the uncached part, within ``ttft_p95_s``

    @property
    def why(self) -> tuple[str, ...]:
        """Everything that holds this candidate back, e.g. "ttft p95 4.2s > slo 3.0s", "unmeasured"."""
        reasons = list(self.blocked_by)
        slo = self.slo
        if self.meets_ttft is False and self.ttft_p95_s is not None and slo.ttft_p95_ms is not None:
            what = "declared ttft" if self.declared else "ttft p95"
            reasons.append(f"{what} {_seconds(self.ttft_p95_s)} > slo {_seconds(slo.ttft_p95_ms / 1000)}")
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


class Standing(NamedTuple):
    """The part of a candidate's evaluation that does not depend on the request.

    It holds for one (view, backend, route) until the stats publish a new view, so a busy gateway
    computes it once per stats refresh instead of once per request and candidate.
    """

    blocked_by: tuple[str, ...]  # everything but the per-request context-window check
    measured: bool
    feasible: bool
    ttft_p95_s: float | None
    first_answer_p95_s: float | None
    decode_tokens_per_s: float | None
    queue_wait_s: float
    usd_per_mtok_out: float | None
    marginal_headroom: bool
    meets_ttft: bool | None
    meets_decode: bool | None
    meets_first_answer: bool | None
    samples: int
    last_sample_at: float | None
    learned_output_tokens: float | None
    default_output_tokens: float  # learned, else the prior for this kind of model; before max_tokens
    rates: CostRates  # USD per prompt token and per output token at this standing
    declared: bool  # unmeasured, and its TTFT is the policy's expected_ttft_ms


def evaluate(req: RequestFeatures, backend: CompiledBackend, view: BackendView, slo: Slo) -> CandidateEval:
    """Predict how ``backend`` would serve ``req`` now and whether that meets ``slo``."""
    return evaluation(req, backend, view, slo, standing_of(backend, view, slo, req.route))


def standing_of(
    backend: CompiledBackend, view: BackendView, slo: Slo, route: str, beyond_max: bool = False
) -> Standing:
    """``beyond_max``: the route may send past ``max_concurrency`` while the predicted TTFT (the
    pool's queue included) still meets its TTFT SLO."""
    blocked_by = _blocked_by(backend, view)
    queued_ahead, queue_wait = predict_queue(backend, view)
    measured = view.samples > 0
    # Until something is measured, the policy's declared figure stands in for the measured p95.
    declared = not measured and backend.expected_ttft_s is not None
    p95 = backend.expected_ttft_s if declared else view.ttft_p95_s
    ttft = None if p95 is None else p95 + queue_wait
    if beyond_max and blocked_by and _within(ttft, slo.ttft_p95_ms):
        blocked_by = tuple(b for b in blocked_by if not b.startswith("at max concurrency"))
    first_answer = None if view.first_answer_p95_s is None else view.first_answer_p95_s + queue_wait
    decode = view.decode_tokens_per_s
    meets_ttft = _within(ttft, slo.ttft_p95_ms)
    meets_first_answer = _within(first_answer, slo.first_answer_p95_ms)
    min_decode = slo.min_decode_tokens_per_s
    meets_decode = None if min_decode is None or decode is None else decode >= min_decode
    feasible = meets_ttft is not False and meets_decode is not False and meets_first_answer is not False
    # Headroom is judged on what is known: unmeasured counts as feasible until traffic says otherwise.
    headroom = not blocked_by and feasible and queued_ahead == 0
    usd_per_mtok = effective_usd_per_mtok(backend, view.aggregate_tokens_per_s)
    learned = view.completion_tokens_by_route.get(route)
    return Standing(
        blocked_by,
        measured,
        feasible,
        ttft,
        first_answer,
        decode,
        queue_wait,
        usd_per_mtok,
        headroom,
        meets_ttft,
        meets_decode,
        meets_first_answer,
        view.samples,
        view.last_sample_at,
        learned,
        predict_output_tokens(prior_output_tokens(backend), learned, None),
        cost_rates(backend, usd_per_mtok, headroom, view.prefill_tokens_per_s),
        declared,
    )


def evaluation(
    req: RequestFeatures, backend: CompiledBackend, view: BackendView, slo: Slo, standing: Standing
) -> CandidateEval:
    blocked_by = standing.blocked_by + _too_long(req, backend)
    headroom = standing.marginal_headroom and not blocked_by
    predicted_output = predict_output_tokens(
        standing.default_output_tokens, standing.learned_output_tokens, req.max_tokens
    )
    rates = (
        standing.rates
        if headroom == standing.marginal_headroom
        else cost_rates(backend, standing.usd_per_mtok_out, headroom, view.prefill_tokens_per_s)
    )
    cached = min(req.cached_tokens.get(backend.name, 0), req.prompt_tokens) if req.cached_tokens else 0
    prefill = uncached_prefill_s(backend, view, req.prompt_tokens, cached)
    ttft, first_answer = standing.ttft_p95_s, standing.first_answer_p95_s
    meets_ttft, meets_first_answer, feasible = (
        standing.meets_ttft,
        standing.meets_first_answer,
        standing.feasible,
    )
    if prefill:
        # The prefill speed is measured as uncached tokens over the whole TTFT, so uncached / speed
        # predicts a whole TTFT: it replaces the measured p95 when longer, it does not add to it.
        ttft = None if ttft is None else max(ttft, standing.queue_wait_s + prefill)
        first_answer = None if first_answer is None else max(first_answer, standing.queue_wait_s + prefill)
        meets_ttft = _within(ttft, slo.ttft_p95_ms)
        meets_first_answer = _within(first_answer, slo.first_answer_p95_ms)
        feasible = feasible_with_prefill(standing, slo, prefill)
    cost = expected_cost(rates, req.prompt_tokens, predicted_output)
    if cost is not None and cached:
        cost -= cached_discount(backend, rates, cached)
    return CandidateEval(
        backend.name,
        not blocked_by,
        standing.measured,
        feasible,
        ttft,
        first_answer,
        standing.decode_tokens_per_s,
        standing.queue_wait_s,
        standing.usd_per_mtok_out,
        cost,
        predicted_output,
        headroom,
        meets_ttft,
        standing.meets_decode,
        meets_first_answer,
        standing.samples,
        standing.last_sample_at,
        blocked_by,
        slo,
        standing.declared,
        cached,
        prefill,
    )


def feasible_with_prefill(standing: Standing, slo: Slo, prefill_s: float) -> bool:
    """Whether the candidate still meets the SLO once ``prefill_s`` of prefill is added to its TTFT."""
    ttft, first_answer = standing.ttft_p95_s, standing.first_answer_p95_s
    return (
        _within(None if ttft is None else max(ttft, standing.queue_wait_s + prefill_s), slo.ttft_p95_ms)
        is not False
        and standing.meets_decode is not False
        and _within(
            None if first_answer is None else max(first_answer, standing.queue_wait_s + prefill_s),
            slo.first_answer_p95_ms,
        )
        is not False
    )


def uncached_prefill_s(backend: CompiledBackend, view: BackendView, prompt_tokens: int, cached: int) -> float:
    """Seconds a long uncached part of the prompt adds to the measured TTFT p95: prefill at the
    backend's measured speed (else the policy's prior). Below ``PREFILL_MIN_TOKENS`` uncached tokens
    the measured TTFT already covers it (the stats measure prefill speed only from there on, too)."""
    uncached = prompt_tokens - cached
    if uncached < PREFILL_MIN_TOKENS:
        return 0.0
    return uncached / pool_prefill_tokens_per_s(backend, view.prefill_tokens_per_s)


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


def _blocked_by(backend: CompiledBackend, view: BackendView) -> tuple[str, ...]:
    if (
        view.healthy
        and not view.booting
        and view.accepts_requests
        and view.inflight < backend.max_concurrency
        and view.paused_until is None
    ):
        return ()  # the common case, kept free of string formatting
    blocked = []
    if view.booting or not view.healthy:
        blocked.append("booting" if view.booting else "unhealthy")
    if not view.accepts_requests:
        blocked.append("circuit open" if view.circuit == "open" else "circuit half_open, probe in flight")
    if view.paused_until is not None:
        blocked.append("paused by an upstream rate limit")
    if view.inflight >= backend.max_concurrency:
        blocked.append(f"at max concurrency {backend.max_concurrency}")
    return tuple(blocked)


def _too_long(req: RequestFeatures, backend: CompiledBackend) -> tuple[str, ...]:
    window = backend.context_window
    if window is None or req.prompt_tokens <= window:
        return ()
    return (f"prompt ~{req.prompt_tokens} tokens > context window {window}",)


def _within(predicted_s: float | None, slo_ms: float | None) -> bool | None:
    if slo_ms is None or predicted_s is None:
        return None
    return predicted_s * 1000.0 <= slo_ms


def _seconds(value: float) -> str:
    return f"{value:.1f}s" if value >= 1.0 else f"{value * 1000.0:.0f}ms"
