"""The objects one gateway process shares, built once at start-up: policy, upstream client, live stats.

Handlers reach it through ``request.app.state.runtime``; nothing lives in module globals. The
request path talks to it through a handful of verbs (decide, attempt_started/finished,
request_finished/failed) so stats, costs, the ledger and metrics plug in here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from gateway.backends.openai_compat import OpenAICompatClient
from gateway.costs import attempt_cost
from gateway.observation import Attempt, Observation
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures, decide
from gateway.signals import SignalScraper
from gateway.stats import AttemptTicket, LiveStats

log = logging.getLogger("gateway")


class PolicySource(Protocol):
    """What holds the running policy: the hot-reloading ``PolicyHolder``, or a fixed one in tests."""

    @property
    def current(self) -> CompiledPolicy: ...


class NeverExplore(random.Random):
    """A draw that never lands inside the exploration share: explain shows the policy's own choice."""

    def random(self) -> float:
        return 1.0


class Runtime:
    def __init__(
        self,
        policy: PolicySource,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        policy_poll_s: float = 1.0,
    ) -> None:
        self.policy_source = policy
        self.clock = clock
        self.rng = rng or random.Random()
        self.upstream = OpenAICompatClient()
        self.stats = LiveStats(clock)
        self.scraper = SignalScraper(self.stats, clock=clock)
        # The last requests, newest last: for /admin, the dashboard and tests.
        self.recent: deque[Observation] = deque(maxlen=256)
        self._tickets: dict[int, AttemptTicket] = {}
        self._policy_poll_s = policy_poll_s
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def policy(self) -> CompiledPolicy:
        return self.policy_source.current

    async def start(self) -> None:
        self.scraper.set_backends(self.policy.backends)
        await self.scraper.start()
        watch = getattr(self.policy_source, "watch", None)
        subscribe = getattr(self.policy_source, "subscribe", None)
        if subscribe is not None:
            subscribe(lambda policy: self.scraper.set_backends(policy.backends))
        if watch is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(watch(self._policy_poll_s)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.scraper.stop()
        await self.upstream.close()

    async def readiness(self) -> dict[str, Any]:
        """Ready when a policy is loaded and at least one of its backends answers."""
        policy = self.policy
        names = list(policy.backends)
        states = await asyncio.gather(*(self.upstream.probe(policy.backends[n]) for n in names))
        backends = dict(zip(names, states, strict=True))
        return {
            "ready": any(state == "ok" for state in states),
            "policy": {"source": policy.source, "digest": policy.digest[:12]},
            "backends": backends,
        }

    def decide(
        self, route: CompiledRoute, prompt_tokens: int, max_tokens: int | None, stream: bool
    ) -> Decision:
        features = RequestFeatures(route.name, prompt_tokens, max_tokens, stream)
        return decide(features, route, self.policy, self.stats.snapshot(route.backends), self.rng)

    def explain(self, route: CompiledRoute, prompt_tokens: int, max_tokens: int | None) -> Decision:
        """The decision a request would get now, without the exploration draw and without sending it."""
        features = RequestFeatures(route.name, prompt_tokens, max_tokens, True)
        return decide(features, route, self.policy, self.stats.snapshot(route.backends), NeverExplore())

    def allows(self, backend: str) -> bool:
        """A fallback re-checks the circuit: it may have opened since the decision."""
        return self.stats.allows_request(backend)

    def attempt_started(self, observation: Observation, backend: str) -> Attempt:
        ticket = self.stats.attempt_started(backend)
        attempt = Attempt(backend=backend, started_at=ticket.started_at)
        self._tickets[id(attempt)] = ticket
        observation.attempts.append(attempt)
        return attempt

    def attempt_finished(self, observation: Observation, attempt: Attempt) -> None:
        ticket = self._tickets.pop(id(attempt), None)
        if ticket is None:
            return  # already settled
        if attempt.finished_at is None:
            attempt.finished_at = self.clock()
        self.stats.attempt_finished(ticket, attempt, observation.route)
        backend = self.policy.backends.get(attempt.backend)
        if attempt.usage is not None and backend is not None:
            cost = attempt_cost(
                backend, attempt.usage, self.stats.view(attempt.backend).aggregate_tokens_per_s
            )
            observation.cost_usd = (observation.cost_usd or 0.0) + cost.usd
            observation.cost_basis = cost.basis

    def request_finished(self, observation: Observation) -> None:
        observation.finished_at = self.clock()
        if observation.final is not None and observation.final.status != "ok":
            observation.status = "error"
            observation.error_type = observation.final.status
        self.recent.append(observation)

    def request_failed(self, observation: Observation, error_type: str) -> None:
        observation.status = "error"
        observation.error_type = error_type
        observation.finished_at = self.clock()
        self.recent.append(observation)

    def cost_header(self, observation: Observation) -> str | None:
        """Settled cost when known (non-streaming); before a stream ends, the decision's estimate."""
        cost = observation.cost_usd if observation.cost_usd is not None else observation.expected_cost_usd
        return None if cost is None else f"{cost:.8f}"
