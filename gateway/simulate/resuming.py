"""A stream cut mid-way, continued as the gateway continues it (``request/resume.py``): when a backend
dies under a stream whose route resumes streams, the attempt is closed with what it generated (and
charged for it), and the next candidate of the same family that can continue it takes over, in the
decision's order, within the route's attempts and deadline. Cut after the thinking, the new backend
is sent the prompt plus the answer so far (and the thinking, for vLLM and llama-server, which render
it before the answer) and generates the rest of the answer; cut during the thinking, the request
starts over there (its thinking too). The client keeps its first token: the TTFT is the first
attempt's.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.measure.stats import LiveStats
from gateway.money.costs import Cost, attempt_cost
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.simulate.backends import Job
from gateway.simulate.timeline import Timeline
from gateway.simulate.workload import SimRequest
from gateway.values.observation import Attempt, Observation, Usage


class Flight(Protocol):
    """What this reads and sets of the engine's request in flight (engine.py sits above this)."""

    req: SimRequest
    route: CompiledRoute
    observation: Observation
    attempt: Attempt | None
    order: tuple[str, ...]
    deadline: float
    resumed_from: str | None


class Simulation(Protocol):
    policy: CompiledPolicy
    timeline: Timeline
    stats: LiveStats
    api_spend: dict[str, float]

    def start_attempt(self, flight: Any, name: str, job: Job) -> None: ...  # the engine's own flight


# The dialects that are handed the thinking so far with the prefill (resume.py's continuation_body).
GIVEN_THE_THINKING = ("vllm", "llamacpp")


def cost_now(stats: LiveStats, backend: CompiledBackend, usage: Usage) -> Cost:
    """An attempt's cost as it ends: a pool's at its live speeds (read without building a view: a
    rebuild per answer cost a tenth of a day's replay); a per-token price reads none."""
    if backend.token_prices is not None:
        return attempt_cost(backend, usage, None)
    return attempt_cost(backend, usage, *stats.cost_speeds(backend.name))


def charge_cut_attempt(sim: Simulation, flight: Flight, job: Job) -> None:
    """What the cut attempt generated before it broke off: its usage, and its cost on the bill."""
    attempt = flight.attempt
    assert attempt is not None
    generated = job.generated_tokens
    reasoning = job.reasoning_tokens
    usage = Usage(job.prompt_tokens, generated, min(reasoning, generated), job.cached_tokens)
    attempt.usage = usage
    if job.first_token_at is not None:
        attempt.ttft_s = job.first_token_at - attempt.started_at
        attempt.decode_s = sim.timeline.now - job.first_token_at
    attempt.token_chunks = generated
    name = attempt.backend
    backend = sim.policy.backends[name]
    cost = cost_now(sim.stats, backend, usage)
    flight.observation.cost_usd = (flight.observation.cost_usd or 0.0) + cost.usd
    if backend.token_prices is not None:
        sim.api_spend[name] = sim.api_spend.get(name, 0.0) + cost.usd


def resume(sim: Simulation, flight: Flight) -> bool:
    """Open the next candidate that can continue ``flight``'s stream; False when none can."""
    route, observation, req = flight.route, flight.observation, flight.req
    if not route.resume_streams or not observation.attempts:
        return False
    cut = observation.attempts[0]
    family = sim.policy.backends[cut.backend].family
    usages = [a.usage for a in observation.attempts if a.usage is not None]
    generated = sum(u.completion_tokens for u in usages)
    thought = sum(u.reasoning_tokens for u in usages)
    answer = generated - thought  # what the client has of the answer: the tokens past the thinking
    if req.max_tokens is not None and generated >= req.max_tokens:
        return False  # nothing left to generate
    tried = {a.backend for a in observation.attempts}
    now = sim.timeline.now
    for name in flight.order:
        backend = sim.policy.backends[name]
        if len(observation.attempts) >= route.fallback.max_attempts or now >= flight.deadline:
            return False
        if name in tried or backend.family != family or (answer and backend.resume == "none"):
            continue
        if not sim.stats.allows_request(name):
            continue
        left = None if req.max_tokens is None else req.max_tokens - generated
        if answer:
            # The rest of the answer, after a prompt that ends with the answer so far.
            prompt = req.prompt_tokens + answer
            if backend.dialect in GIVEN_THE_THINKING:
                prompt += thought
            output, reasoning = max(1, req.output_tokens - req.reasoning_tokens - answer), 0
        else:
            prompt, output, reasoning = req.prompt_tokens, req.output_tokens, req.reasoning_tokens
        if left is not None:
            output = min(output, max(1, left))
        flight.resumed_from = cut.backend
        job = Job(prompt, output, flight, None)
        job.reasoning_tokens = min(reasoning, output)
        sim.start_attempt(flight, name, job)
        assert flight.attempt is not None
        flight.attempt.resumed = "continued" if answer else "restarted"
        return True
    return False
