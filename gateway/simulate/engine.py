"""The simulation: each request of a workload goes through the gateway's own decision, live stats,
circuit breakers, budgets and cost model, on a virtual clock, against backend performance models.

The request path mirrors the gateway's (decide -> admit against budgets -> attempts in order with
fallback until one answers -> stats, cost, settlement); only the network is replaced. The gateway's
synthetic probes run too (``probing.py``), so a recovery is noticed when the gateway would notice it,
and a request whose candidates are all full waits in the route's bounded queue (``waiting.py``).
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from gateway.measure.stats import AttemptTicket, LiveStats
from gateway.money.budgets import BudgetExhausted, Budgets, Reservation
from gateway.money.costs import SECONDS_PER_HOUR
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, DecisionMemo, RequestFeatures, decide
from gateway.simulate import resuming
from gateway.simulate.backends import BackendModel, FailureKind, Job
from gateway.simulate.probing import ProbeFlight, SimProber
from gateway.simulate.scraping import SimScraper
from gateway.simulate.timeline import Timeline
from gateway.simulate.waiting import SimWaitingRoom
from gateway.simulate.watched_stats import WatchedStats
from gateway.simulate.workload import Fault, SimRequest, Workload, backend_profile, requests_between
from gateway.store.memory import MemoryStore
from gateway.values.observation import Attempt, Observation, Usage

T = TypeVar("T")


class Router(Protocol):
    """Orders a route's backends for one request: the policy's ``decide``, or a baseline."""

    name: str

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision: ...


class Outcome(NamedTuple):
    """One request as its client saw it."""

    at: float
    route: str
    backend: str | None  # the one that answered (or the last tried)
    ok: bool
    ttft_s: float | None  # from arrival to the first token, failed attempts included
    decode_tokens_per_s: float | None
    output_tokens: int
    cost_usd: float  # attributed, as the ledger would charge it
    within_slo: bool
    attempts: int
    error: str | None
    prompt_tokens: int = 0  # of the answered attempt
    cached_tokens: int = 0  # of those, found in the serving backend's prefix cache
    resumed: bool = False  # an attempt took over a cut stream (the ledger's attempt_log "resumed")


@dataclass
class RunResult:
    name: str
    duration_s: float
    outcomes: list[Outcome]
    pool_hour_usd: dict[str, float]  # GPU-hour pools: paid for the whole run, used or not
    api_usd: dict[str, float]  # per-token backends: what their tokens cost
    budget_exhausted_at: dict[str, float] = field(default_factory=dict)  # cap -> first refusal (s)


class _Flight:
    """One request in flight: its observation, its remaining order and its current attempt."""

    __slots__ = ("attempt", "deadline", "first_token_at", "job", "observation", "order", "req",
                 "reservation", "resumed_from", "route", "started_wall", "ticket", "tried")  # fmt: skip

    def __init__(self, req: SimRequest, route: CompiledRoute, observation: Observation, wall: float) -> None:
        self.req = req
        self.route = route
        self.observation = observation
        self.started_wall = wall
        self.order: tuple[str, ...] = ()
        self.reservation: Reservation | None = None  # what its budgets hold for it until it ends
        self.tried = 0
        self.deadline = req.at + route.fallback.deadline_s
        self.job: Job | None = None
        self.attempt: Attempt | None = None
        self.ticket: AttemptTicket | None = None
        self.first_token_at: float | None = None
        self.resumed_from: str | None = None  # the backend a cut stream was taken over from


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (the in-memory store's) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    coroutine.close()
    raise RuntimeError("the simulation's store awaited something: it must never wait")


class Simulation:
    def __init__(self, policy: CompiledPolicy, workload: Workload, router: Router, seed: int = 0) -> None:
        self.policy = policy
        self.workload = workload
        self.router = router
        self.timeline = Timeline()
        self.stats: LiveStats = (watched := WatchedStats(self.timeline.clock))  # tell the prober what's new
        self.rng = random.Random(seed)
        self.memo: DecisionMemo = {}
        self.start_wall = workload.start_wall
        self.budgets = Budgets(MemoryStore(wall_clock=self.wall))
        self.models: dict[str, BackendModel] = {}
        for name, backend in policy.backends.items():
            profile = backend_profile(workload.backends.get(name), backend.dialect)
            backend_rng = random.Random(seed * 1_000_003 + zlib.crc32(name.encode()))
            self.models[name] = BackendModel(name, profile, self.timeline, backend_rng, self)
        self.scraper = SimScraper(
            policy, self.stats, self.timeline, self.models, lambda: not self._end_of_run
        )
        self.prober = SimProber(policy, watched, self.timeline, self.models, lambda: not self._end_of_run)
        self.waiting = SimWaitingRoom(self.timeline, self._decide, self._admit, self._busy)
        self.outcomes: list[Outcome] = []
        self.budget_exhausted_at: dict[str, float] = {}
        self.api_spend: dict[str, float] = {}
        self._end_of_run = False
        self._request_ids = itertools.count()
        self.current_request: SimRequest | None = None  # the one being decided, for routers that key on it

    def wall(self) -> float:
        return self.start_wall + self.timeline.now

    # -- the run ------------------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> RunResult:
        timeline = self.timeline
        for fault in self.workload.faults:
            self._schedule_fault(fault)
        self.scraper.start()
        self.prober.start()
        requests = self.workload.requests
        steps = 100
        end = self.workload.duration_s
        for step in range(1, steps + 1):
            until = end * step / steps
            # Arrivals are fed in slices, so the heap holds only what is in flight.
            for req in requests_between(requests, end * (step - 1) / steps, until, last=step == steps):
                timeline.schedule(req.at, self._arrive, req)
            timeline.run_until(until)
            if progress is not None:
                progress(step / steps)
        self._end_of_run = True
        timeline.run_until(end + max((r.fallback.deadline_s for r in self.policy.routes.values()), default=0))
        return self._result()

    def _result(self) -> RunResult:
        hours = self.workload.duration_s / SECONDS_PER_HOUR
        pools = {
            name: backend.pool_price.usd_per_hour * hours
            for name, backend in self.policy.backends.items()
            if backend.pool_price is not None
        }
        api = {name: 0.0 for name, b in self.policy.backends.items() if b.pool_price is None}
        api.update(self.api_spend)
        for name, usd in self.prober.spent_usd.items():  # the bill pays for probes too
            api[name] = api.get(name, 0.0) + usd
        outcomes = sorted(self.outcomes, key=lambda o: o.at)
        return RunResult(
            self.router.name, self.workload.duration_s, outcomes, pools, api, self.budget_exhausted_at
        )

    # -- a request ----------------------------------------------------------------------------------

    def _arrive(self, req: SimRequest) -> None:
        route = self.policy.routes.get(req.route)
        now = self.timeline.now
        if route is None:
            self._record_unrouted(req, "model_not_found")
            return
        observation = Observation(
            request_id=str(next(self._request_ids)),
            route=route.name,
            endpoint="chat",
            stream=req.stream,
            started_at=now,
            max_tokens=req.max_tokens,
        )
        flight = _Flight(req, route, observation, self.wall())
        decision = self._decide(flight)
        if not decision.order:
            refused = self.waiting.enter(flight, route, decision, flight.deadline)
            if refused is not None:
                self._finish(flight, refused)
            return
        self._admit(flight, decision)

    def _decide(self, flight: _Flight) -> Decision:
        req = self.current_request = flight.req
        features = RequestFeatures(flight.route.name, req.prompt_tokens, req.max_tokens, req.stream)
        return self.router.decide(self, features, flight.route)

    def _busy(self, flight: _Flight) -> None:
        self._finish(flight, "backends_busy")

    def _admit(self, flight: _Flight, decision: Decision) -> None:
        observation, route, now = flight.observation, flight.route, self.timeline.now
        observation.decision_reason = decision.reason
        try:
            flight.order, _, flight.reservation = run_now(
                self.budgets.admit(observation, route, decision, self.policy, self.wall())
            )
        except BudgetExhausted as exc:
            key = f"route {route.name}"
            self.budget_exhausted_at.setdefault(key, now)
            self._finish(flight, exc.code or "budget_exhausted")
            return
        self._next_attempt(flight)

    def _next_attempt(self, flight: _Flight) -> None:
        now = self.timeline.now
        max_attempts = flight.route.fallback.max_attempts
        while flight.tried < min(len(flight.order), max_attempts) and now < flight.deadline:
            name = flight.order[flight.tried]
            flight.tried += 1
            if flight.observation.attempts and not self.stats.allows_request(name):
                continue
            output = flight.req.output_tokens
            if flight.req.max_tokens is not None:
                output = min(output, flight.req.max_tokens)
            job = Job(flight.req.prompt_tokens, output, flight, flight.req.shape)
            job.reasoning_tokens = min(flight.req.reasoning_tokens, output)
            self.start_attempt(flight, name, job)
            return
        self._finish(flight, "upstream_failed")

    def start_attempt(self, flight: _Flight, name: str, job: Job) -> None:
        now = self.timeline.now
        flight.ticket = self.stats.attempt_started(name)
        flight.attempt = Attempt(backend=name, started_at=now)
        flight.observation.attempts.append(flight.attempt)
        flight.job = job
        self.models[name].submit(job)
        wait = min(self.policy.backends[name].timeouts.first_byte_s, flight.deadline - now)
        self.timeline.schedule(now + wait, self._first_byte_timeout, job)

    def _first_byte_timeout(self, job: Job) -> None:
        flight: _Flight = job.owner
        if flight.job is not job or job.state not in ("waiting", "prefill"):
            return
        assert flight.attempt is not None  # a flight's job belongs to its current attempt
        self.models[flight.attempt.backend].cancel(job)
        self._attempt_failed(flight, "timeout", None)

    # JobSink: what the backend models report.

    def first_token(self, job: Job) -> None:
        flight = job.owner
        if isinstance(flight, _Flight) and flight.job is job and flight.first_token_at is None:
            flight.first_token_at = self.timeline.now

    def finished(self, job: Job) -> None:
        if isinstance(job.owner, ProbeFlight):
            self.prober.finished(job)
            return
        flight: _Flight = job.owner
        if flight.job is not job or flight.attempt is None or flight.ticket is None:
            return
        now = self.timeline.now
        attempt = flight.attempt
        name = attempt.backend
        first = job.first_token_at if job.first_token_at is not None else now
        reasoning = job.reasoning_tokens
        attempt.finished_at = now
        if flight.req.stream or self.policy.backends[name].dialect == "llamacpp":
            attempt.ttft_s = first - attempt.started_at  # streams show it; llama.cpp's timings too
            share = reasoning / job.output_tokens if job.output_tokens else 0.0
            attempt.first_answer_s = attempt.ttft_s + (now - first) * share
        attempt.decode_s = now - first
        attempt.token_chunks = job.output_tokens
        usage = Usage(job.prompt_tokens, job.output_tokens, reasoning, job.cached_tokens)
        attempt.usage = usage
        self.stats.attempt_finished(flight.ticket, attempt, flight.route.name)
        observe = getattr(self.router, "observe", None)
        if observe is not None and attempt.ttft_s is not None:
            observe(name, attempt.ttft_s)  # routers that learn from answers (lowest latency)
        answered = getattr(self.router, "answered", None)
        if answered is not None:
            answered(flight.req, name, job.cached_tokens, now)  # routers that index prefixes
        backend = self.policy.backends[name]
        cost = resuming.cost_now(self.stats, backend, usage)
        flight.observation.cost_usd = (flight.observation.cost_usd or 0.0) + cost.usd
        if backend.token_prices is not None:
            self.api_spend[name] = self.api_spend.get(name, 0.0) + cost.usd
        self._finish(flight, None)
        self.waiting.notify()  # a place freed

    def failed(self, job: Job, kind: FailureKind) -> None:
        if isinstance(job.owner, ProbeFlight):
            self.prober.failed(job, job.http_status)
            return
        flight: _Flight = job.owner
        if flight.job is not job:
            return
        self._attempt_failed(flight, kind, job.http_status)

    def _attempt_failed(self, flight: _Flight, status: Any, http_status: int | None) -> None:
        attempt, ticket = flight.attempt, flight.ticket
        assert attempt is not None and ticket is not None
        attempt.status = status
        attempt.http_status = http_status
        attempt.finished_at = self.timeline.now
        job, flight.job = flight.job, None
        if status == "dropped" and job is not None and flight.req.stream:
            resuming.charge_cut_attempt(self, flight, job)
        self.stats.attempt_finished(ticket, attempt, flight.route.name)
        if flight.req.stream and (status == "dropped" or flight.resumed_from is not None):
            # Bytes already reached the client: no fallback, but a resume where the route has one.
            if not resuming.resume(self, flight):
                self._finish(flight, "upstream_dropped")
            self.waiting.notify()
            return
        flight.first_token_at = None
        self._next_attempt(flight)
        self.waiting.notify()

    def _finish(self, flight: _Flight, error: str | None) -> None:
        observation = flight.observation
        observation.finished_at = self.timeline.now
        if error is not None:
            observation.status, observation.error_type = "error", error
        self.budgets.settle(flight.reservation, observation, flight.started_wall)
        attempt = flight.attempt
        ok = error is None and attempt is not None and attempt.status == "ok"
        ttft = None if not ok or flight.first_token_at is None else flight.first_token_at - flight.req.at
        decode = attempt.decode_tokens_per_s if ok and attempt is not None else None
        output = sum(a.usage.completion_tokens for a in observation.attempts if a.usage) if ok else 0
        self.outcomes.append(
            Outcome(
                flight.req.at,
                flight.route.name,
                observation.backend,
                ok,
                ttft,
                decode,
                output,
                observation.cost_usd or 0.0,
                ok and _within_slo(flight.route, ttft, decode),
                len(observation.attempts),
                error,
                flight.req.prompt_tokens if ok else 0,
                flight.job.cached_tokens if ok and flight.job is not None else 0,
                any(a.resumed for a in observation.attempts),
            )
        )
        # Unlinked from its job (a cycle): reference counting frees both, not the cyclic collector.
        flight.job = None

    def _record_unrouted(self, req: SimRequest, error: str) -> None:
        self.outcomes.append(Outcome(req.at, req.route, None, False, None, None, 0, 0.0, False, 0, error))

    # -- the world around the requests (and scraping.py) ---------------------------------------------

    def _schedule_fault(self, fault: Fault) -> None:
        model = self.models.get(fault.backend)
        if model is None:
            raise ValueError(f"a fault names backend {fault.backend!r}, which the policy does not have")
        self.timeline.schedule(fault.start_s, model.apply_fault, fault, True)
        self.timeline.schedule(fault.end_s, model.apply_fault, fault, False)


def _within_slo(route: CompiledRoute, ttft_s: float | None, decode: float | None) -> bool:
    slo = route.slo
    if slo.ttft_p95_ms is not None and (ttft_s is None or ttft_s * 1000.0 > slo.ttft_p95_ms):
        return False
    return not (
        slo.min_decode_tokens_per_s is not None
        and decode is not None
        and decode < slo.min_decode_tokens_per_s
    )


def policy_router_decide(sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
    """The gateway's own decision, exactly as the request path calls it."""
    snapshot = sim.stats.snapshot(route.backends)
    return decide(features, route, sim.policy, snapshot, sim.rng, sim.memo)


class PolicyRouter:
    def __init__(self, name: str) -> None:
        self.name = name

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        return policy_router_decide(sim, features, route)
