"""The policy's ``tuning`` section: the numbers the gateway learns and judges with (circuits, how live
measurements age, output-length priors, probes). Part of the policy file's shape (``schema.py``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gateway.policy.strict import NonNegativeFloat, PositiveFloat, Strict


class CircuitTuning(Strict):
    """When a backend's circuit opens and how long it stays open (per backend, per replica)."""

    # Consecutive failed attempts that open the circuit.
    failure_threshold: Annotated[int, Field(ge=1, le=1000)] = 5
    # Or: a decayed failure share above this, over at least ``min_volume`` decayed attempts.
    failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    min_volume: PositiveFloat = 10.0
    half_life_s: PositiveFloat = 30.0  # how fast old outcomes stop counting toward that share
    # The first cool-down before a probe; it doubles on each failed probe, up to the maximum.
    base_cooldown_s: PositiveFloat = 1.0
    max_cooldown_s: PositiveFloat = 30.0

    @model_validator(mode="after")
    def cooldowns_in_order(self) -> CircuitTuning:
        if self.max_cooldown_s < self.base_cooldown_s:
            raise ValueError("max_cooldown_s must be at least base_cooldown_s")
        return self


class StatsTuning(Strict):
    """How live measurements age: each sample's weight halves every ``half_life_s``; quantiles look at
    the last ``window`` samples per backend."""

    half_life_s: PositiveFloat = 60.0
    window: Annotated[int, Field(ge=8, le=100_000)] = 256


class PriorOutputTokens(Strict):
    """Completion tokens (thinking included) to expect from a backend before any has been measured,
    by its ``thinking`` mode: a mandatory-thinking model reasons at length before it answers."""

    mandatory: PositiveFloat = 1000.0
    optional: PositiveFloat = 400.0
    none: PositiveFloat = 400.0


class ProbeTuning(Strict):
    """Small synthetic requests (one short prompt, ``max_tokens: 1``) that keep the stats of candidates
    the routing avoids fresh, so a recovery is noticed without spending users' requests on it."""

    # Off: no probe at all (routes with an SLO then learn only from users' requests).
    enabled: bool = True
    # A candidate of a route with an SLO that has had no sample for this long is probed.
    interval_s: PositiveFloat = 15.0
    # Probe every healthy backend once at start-up and when a reload adds one.
    on_start: bool = True
    # /ready answers 503 until the start-up probes have shown each route with an SLO where to send
    # (a candidate measured within it, or every candidate measured), or for this long after start.
    startup_timeout_s: PositiveFloat = 30.0
    # Paid (per-token) backends are probed only within this spend per hour; pools only with headroom.
    paid_budget_usd_per_hour: NonNegativeFloat = 0.05
    # Consecutive probes that answer within the SLOs of the routes that exclude a backend show it
    # recovered: the samples from the slow spell stop counting. They go out one after another once the
    # first answers within. A backend no route excludes needs probes ``recovery_ratio`` times its p50.
    recovery_probes: Annotated[int, Field(ge=1, le=100)] = 2
    recovery_ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5


class Tuning(Strict):
    """The numbers the gateway learns and judges with. The defaults suit most deployments; the circuit
    and stats settings are read at start-up, the priors and ``chars_per_token`` on every request."""

    circuit: CircuitTuning = CircuitTuning()
    stats: StatsTuning = StatsTuning()
    prior_output_tokens: PriorOutputTokens = PriorOutputTokens()
    probes: ProbeTuning = ProbeTuning()
    # A pool's prompt-processing speed (tokens/s) until measured on prompts of 8,000+ tokens.
    prior_prefill_tokens_per_s: PositiveFloat = 10_000.0
    # Characters per token, to estimate a prompt's tokens before sending (and usage nobody reported).
    chars_per_token: Annotated[float, Field(gt=0, le=100)] = 4.0
