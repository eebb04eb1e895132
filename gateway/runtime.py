"""The objects one gateway process shares, built once at start-up: policy, upstream, stats, store.

Handlers reach it through ``request.app.state.runtime``; nothing lives in module globals. The
request path talks to it through a handful of verbs (decide, attempt_started/finished,
request_finished/failed) so stats, costs, the ledger and metrics plug in here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from starlette.datastructures import Headers

from gateway.auth import ApiKey, AuthenticationFailed, PermissionDenied, authenticate
from gateway.backends.openai_compat import OpenAICompatClient
from gateway.budgets import BudgetExhausted, Budgets
from gateway.costs import attempt_cost
from gateway.errors import GatewayError, UpstreamClientError, UpstreamError
from gateway.fleet import Fleet
from gateway.ledger import row_of
from gateway.ledger.settings import open_ledger, replica_name
from gateway.ledger.view import LedgerView
from gateway.metrics import GatewayMetrics
from gateway.observation import Attempt, Observation
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, DecisionMemo, RequestFeatures, decide
from gateway.ratelimit import RateLimited, RateLimits
from gateway.signals import SignalScraper
from gateway.spend import SpendTally, seed_tally
from gateway.stats import AttemptTicket, LiveStats
from gateway.store import StoreUnavailable, open_store

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
        require_keys: bool = False,
        ledger_path: str | Path | None = None,
        wall_clock: Callable[[], float] = time.time,
        redis_url: str | None = None,
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
        self._decision_memo: DecisionMemo = {}
        # Request ids: random per process, then counted (a syscall per request for randomness is waste).
        self._request_id_prefix = os.urandom(6).hex()
        self._request_ids = itertools.count(1)
        # Error responses by (origin, code): "gateway" refusals (auth, bad request, budget) apart from
        # "upstream" faults, so an operator can tell whose problem an error rate is.
        self.errors_returned: Counter[tuple[str, str]] = Counter()
        self._policy_poll_s = policy_poll_s
        # Set when listening beyond loopback: a policy without keys then refuses every request
        # (fail closed), even if a reload removed the keys after start-up.
        self.require_keys = require_keys
        self._tasks: list[asyncio.Task[Any]] = []
        # Spend: each finished request feeds its ledger row, live totals, budget counters and metrics.
        self.wall_clock = wall_clock
        self.ledger = open_ledger(self.policy.ledger, ledger_path)
        self.replica = replica_name()
        self.spend = SpendTally()
        self.ledger_view = LedgerView(self.ledger.database, wall_clock)
        # Shared state: ``redis_url`` (the CLI's) wins over the policy's store.redis_url; none: memory.
        self.store = open_store(self.policy.store, redis_url, wall_clock)
        self.budgets = Budgets(self.store)
        self.rate_limits = RateLimits(self.store)
        self.fleet: Fleet | None = None
        if self.store.shared:
            interval = self.policy.store.sync_interval_s
            self.fleet = Fleet(self.stats, self.store, lambda: self.policy, clock, interval)
        self.metrics = GatewayMetrics(self)

    @property
    def policy(self) -> CompiledPolicy:
        return self.policy_source.current

    async def start(self) -> None:
        await self.store.start()
        await self._start_spend()
        self.scraper.set_backends(self.policy.backends)
        await self.scraper.start()
        watch = getattr(self.policy_source, "watch", None)
        subscribe = getattr(self.policy_source, "subscribe", None)
        if subscribe is not None:
            subscribe(lambda policy: self.scraper.set_backends(policy.backends))
            subscribe(lambda policy: self.metrics.policy_installed(self.wall_clock()))
        loop = asyncio.get_running_loop()
        if watch is not None:
            self._tasks.append(loop.create_task(watch(self._policy_poll_s)))
        if self.fleet is not None:
            self._tasks.append(loop.create_task(self.fleet.run()))
        self._tasks.extend(loop.create_task(task) for task in self.metrics.background())
        self._tasks.append(loop.create_task(self.ledger_view.run()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.scraper.stop()
        await self.upstream.close()
        # Last: uvicorn has already drained in-flight requests, so every row is in the queue by now.
        await self.budgets.close()
        await self.ledger.close()
        self.metrics.close()

    async def readiness(self) -> dict[str, Any]:
        """Ready when a policy is loaded, at least one of its backends answers and the store can admit
        requests (it answers, or the policy fails open)."""
        policy = self.policy
        names = list(policy.backends)
        states = await asyncio.gather(*(self.upstream.probe(policy.backends[n]) for n in names))
        backends = dict(zip(names, states, strict=True))
        store = self.store.report()
        if self.fleet is not None:
            store["fleet"] = self.fleet.report()
        return {
            "ready": any(state == "ok" for state in states) and self.store.health.serving,
            "pid": os.getpid(),  # which worker answered, with ``serve --workers``
            "policy": {"source": policy.source, "digest": policy.digest[:12]},
            "backends": backends,
            "store": store,
        }

    def decide(
        self, route: CompiledRoute, prompt_tokens: int, max_tokens: int | None, stream: bool
    ) -> Decision:
        features = RequestFeatures(route.name, prompt_tokens, max_tokens, stream)
        snapshot = self.stats.snapshot(route.backends)
        return decide(features, route, self.policy, snapshot, self.rng, self._decision_memo)

    def authenticate(self, headers: Headers) -> ApiKey | None:
        keys = self.policy.api_keys
        if not keys and self.require_keys:
            raise AuthenticationFailed("this gateway listens beyond loopback and its policy has no API keys")
        return authenticate(keys, headers)

    def authorize_admin(self, headers: Headers) -> None:
        key = self.authenticate(headers)
        if key is not None and not key.admin:
            raise PermissionDenied(f"the API key '{key.name}' is not an admin key", code="admin_only")

    def new_request_id(self) -> str:
        return f"{self._request_id_prefix}{next(self._request_ids):012x}"

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
        if self.fleet is not None:
            self.fleet.attempt_finished(attempt, observation.route)
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
        self._account(observation)

    def request_failed(self, observation: Observation, error_type: str) -> None:
        observation.status = "error"
        observation.error_type = error_type
        observation.finished_at = self.clock()
        self.recent.append(observation)
        self._account(observation)

    def error_returned(self, error: GatewayError) -> None:
        origin = "upstream" if isinstance(error, (UpstreamError, UpstreamClientError)) else "gateway"
        self.errors_returned[(origin, error.code or error.type)] += 1

    def cost_header(self, observation: Observation) -> str | None:
        """Settled cost when known (non-streaming); before a stream ends, the decision's estimate."""
        cost = observation.cost_usd if observation.cost_usd is not None else observation.expected_cost_usd
        return None if cost is None else f"{cost:.8f}"

    async def admit(
        self, observation: Observation, route: CompiledRoute, decision: Decision
    ) -> tuple[str, ...]:
        """Reserve the request's predicted cost against its budgets and charge its key's rate limits,
        in one step of the store; returns the backends it may try.

        A refused request is settled here (its ledger row names the refusal), then the error raised.
        """
        policy = self.policy
        try:
            if not self.store.health.serving:
                raise self.store.health.unavailable()
            charges = self.rate_limits.charges(observation, decision, policy)
            order, verdict = await self.budgets.admit(
                observation, route, decision, policy, self.wall_clock(), charges
            )
            if verdict.status == "limited":
                raise self.rate_limits.refused(verdict, charges, observation.api_key_name or "")
        except (BudgetExhausted, RateLimited, StoreUnavailable) as exc:
            self.request_failed(observation, exc.code or exc.type)
            raise
        self.rate_limits.hold(observation, charges, verdict)
        return order

    def request_abandoned(self, observation: Observation, error: BaseException) -> None:
        """An exception no step settled (a bug, a cancellation): settle it now, so the reservation is
        released and the request still gets its ledger row."""
        if observation.finished_at is None:
            cancelled = isinstance(error, asyncio.CancelledError)
            self.request_failed(observation, "cancelled" if cancelled else "internal_error")

    async def _start_spend(self) -> None:
        await self.ledger.start()
        # Today's spend and this period's budget counters carry over a restart, from the ledger.
        await asyncio.to_thread(seed_tally, self.spend, self.ledger.database, self.wall_clock())
        await self.budgets.seed(self.ledger.database, self.wall_clock())

    def _account(self, observation: Observation) -> None:
        """Settle a finished request: its budget reservation, ledger row, live spend and metrics."""
        started_wall = self.wall_clock() - (self.clock() - observation.started_at)
        reserved = self.budgets.settle(observation, started_wall)
        self.rate_limits.settle(observation)
        backend = self.policy.backends.get(observation.backend or "")
        row = row_of(
            observation, started_wall, None if backend is None else backend.model, reserved, self.replica
        )
        self.ledger.append(row)
        self.spend.add(started_wall, observation.route, row.cost_usd)
        self.metrics.request_finished(observation)
