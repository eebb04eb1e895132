"""The objects one gateway process shares, built once at start-up: policy, backends, stats, store.

Handlers reach it through ``request.app.state.runtime``; nothing lives in module globals. The request
path sits above it and calls down through a few verbs (decide, admit, attempt_finished, settle), each
handed plain values (the request's own policy snapshot, its observation, its reservations), so stats,
costs, the ledger and metrics plug in here without this module knowing the request path's objects.
"""

from __future__ import annotations

import asyncio
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

from gateway.backends import Backends
from gateway.errors import GatewayError, UpstreamClientError, UpstreamError
from gateway.ledger.settings import open_ledger, replica_name, resolve_ledger
from gateway.measure.backend_stats import backend_state
from gateway.measure.demand import DemandSignal
from gateway.measure.fleet import Fleet
from gateway.measure.health import CircuitBreaker
from gateway.measure.prefix_index import NO_KEYS, PromptKeys
from gateway.measure.prefixes import Prefixes
from gateway.measure.probes import Prober
from gateway.measure.scraper import SignalScraper
from gateway.measure.stats import AttemptTicket, LiveStats
from gateway.metrics import GatewayMetrics
from gateway.metrics.capacity import CapacityCollector
from gateway.metrics.ledger_view import LedgerView
from gateway.metrics.live import MetricSources
from gateway.metrics.routing import RoutingCollector
from gateway.money.budgets import Budgets
from gateway.money.ratelimit import RateLimits
from gateway.money.spend import SpendTally
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, DecisionMemo, RequestFeatures, decide
from gateway.runtime.admission import InFlight
from gateway.runtime.books import Books
from gateway.runtime.drain import Drain
from gateway.runtime.stopping import CLOSE_BUDGET_S, Stage, cancel_tasks, close_in_stages
from gateway.runtime.waiting import WaitingRoom, retry_after_seconds
from gateway.store import open_store
from gateway.telemetry.tracer import start_tracing
from gateway.values.auth import ApiKey, AuthenticationFailed, PermissionDenied, authenticate
from gateway.values.observation import Attempt, Observation

log = logging.getLogger("gateway")


class PolicySource(Protocol):
    """What holds the running policy: the hot-reloading ``PolicyHolder``, or a fixed one in tests."""

    @property
    def current(self) -> CompiledPolicy: ...


class NeverExplore(random.Random):
    """A draw that never lands inside the exploration share: explain shows the policy's own choice."""

    def random(self) -> float:
        return 1.0


class Runtime(Books):
    """The process's shared objects and the verbs the request path calls; the money and the record of a
    request (admit, pricing, settle) are ``Books``' (``runtime/books.py``)."""

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
        self.backends = Backends()  # one HTTP stack for upstream traffic: completions, signals, health
        tuning = self.policy.tuning  # circuit and stats settings are read once, here
        self.stats = LiveStats(
            clock,
            half_life_s=tuning.stats.half_life_s,
            window=tuning.stats.window,
            make_breaker=lambda breaker_clock: CircuitBreaker(breaker_clock, **tuning.circuit.model_dump()),
        )
        self.scraper = SignalScraper(self.stats, self.backends.fetch, clock=clock)
        # The last requests, newest last: for /admin, the dashboard and tests.
        self.recent: deque[Observation] = deque(maxlen=256)
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
        location = resolve_ledger(ledger_path, lambda: self.policy)
        self.ledger = open_ledger(self.policy.ledger, location.target)
        self.replica = replica_name()
        self.spend = SpendTally()
        self.ledger_view = LedgerView(self.ledger.database, wall_clock)
        # Shared state: ``redis_url`` (the CLI's) wins over the policy's store.redis_url; none: memory.
        self.store = open_store(self.policy.store, redis_url, wall_clock)
        self.budgets = Budgets(self.store)
        self.rate_limits = RateLimits(self.store)
        # Where each backend likely holds a prompt's prefix (cache-aware routing), shared by the fleet.
        self.prefixes = Prefixes(lambda: self.policy, clock)
        self.fleet: Fleet | None = None
        if self.store.shared:
            interval = self.policy.store.sync_interval_s
            self.fleet = Fleet(self.stats, self.store, lambda: self.policy, clock, interval, self.prefixes)
        self.waiting = WaitingRoom(clock)
        self.probes = Prober(
            lambda: self.policy,
            self.stats,
            self.backends,
            self.ledger,
            self.fleet,
            clock,
            wall_clock,
            self.rate_limited,
        )
        self.metrics = GatewayMetrics(
            MetricSources(
                policy=lambda: self.policy,
                policy_source=self.policy_source,
                stats=self.stats,
                budgets=self.budgets,
                ledger=self.ledger,
                store_health=self.store.health,
                errors_returned=self.errors_returned,
                wall_clock=wall_clock,
            )
        )
        routing = RoutingCollector(self.probes.sent, lambda: self.policy, self.stats, self.waiting, clock)
        self.metrics.registry.register(routing)
        # Arrivals per route feed the desired-replicas signal an autoscaler reads (gateway advise's model).
        self.demand = DemandSignal(clock)
        self.metrics.registry.register(CapacityCollector(self.demand, lambda: self.policy, self.stats))
        # Called with each settled request, after the ledger and metrics (the demo prints a line).
        self.request_listeners: list[Callable[[Observation], None]] = []
        self.drain = Drain()  # a graceful stop in progress (``gateway serve`` on SIGTERM)
        self.in_flight = InFlight()  # completion requests being served, bounded by server.max_in_flight
        # OpenTelemetry traces (gateway/telemetry): None, the default, when no OTLP endpoint is named.
        self.tracer = self.probes.tracer = start_tracing(
            self.policy.telemetry, clock, wall_clock, self.metrics.registry
        )

    @property
    def policy(self) -> CompiledPolicy:
        return self.policy_source.current

    async def start(self) -> None:
        await self.store.start()
        await self._start_spend()
        self.scraper.set_backends(self.policy.backends)
        await self.scraper.start()
        self.probes.set_backends(self.policy.backends)
        watch = getattr(self.policy_source, "watch", None)
        subscribe = getattr(self.policy_source, "subscribe", None)
        loop = asyncio.get_running_loop()
        if subscribe is not None:
            # A reload may run in a worker thread (POST /admin/policy/reload): the scraper's loops
            # belong to the event loop, so the change is handed over to it.
            subscribe(lambda policy: loop.call_soon_threadsafe(self.scraper.set_backends, policy.backends))
            subscribe(lambda policy: loop.call_soon_threadsafe(self.probes.set_backends, policy.backends))
            subscribe(lambda policy: self.metrics.policy_installed(self.wall_clock()))
            subscribe(lambda policy: loop.call_soon_threadsafe(self.prefixes.index.reconfigure))
        if watch is not None:
            self._tasks.append(loop.create_task(watch(self._policy_poll_s)))
        if self.fleet is not None:
            self._tasks.append(loop.create_task(self.fleet.run()))
        self._tasks.extend(loop.create_task(task) for task in self.metrics.background())
        self._tasks.append(loop.create_task(self.probes.run()))
        self._tasks.append(loop.create_task(self.ledger_view.run()))

    async def close(self) -> None:
        """Each stage bounded (``gateway.runtime.stopping``): a stop always ends, whatever still waits."""

        async def background() -> None:
            await cancel_tasks(self._tasks, 1.0)

        async def metrics() -> None:
            self.metrics.close()

        async def exporter() -> None:  # what is queued goes out, within the exporter's own bound
            if self.tracer is not None:
                await self.tracer.close()

        await close_in_stages([
            Stage("background tasks (policy watch, fleet sync, ledger view)", background, 1.0),
            Stage("probes", self.probes.close, 1.0),
            Stage("scraper", self.scraper.stop, 1.0),
            Stage("backend connections", self.backends.close, 1.0),
            Stage("budgets and the shared store", self.budgets.close, 2.0),
            # Last: uvicorn has already drained in-flight requests, so every row is in the queue by now.
            Stage("ledger flush", self.ledger.close, CLOSE_BUDGET_S, self._rows_unwritten),
            Stage("metrics", metrics, 1.0),
            Stage("trace exporter", exporter, 3.0),
        ])  # fmt: skip

    def _rows_unwritten(self) -> str:
        return f"{self.ledger.pending} rows unwritten"

    async def readiness(self) -> dict[str, Any]:
        """Ready when a policy is loaded, at least one of its backends is up, as the signal scraper and
        the circuits last saw it (nothing is probed here), the store can admit requests, and the
        start-up probes have shown each route with an SLO where to send (within a start-up timeout),
        so a rolling restart never sends a first request blind."""
        policy = self.policy
        await self.scraper.first_round_done()
        scraped = self.scraper.status()
        backends = {name: backend_state(self.stats.view(name), scraped.get(name)) for name in policy.backends}
        store = self.store.report()
        if self.fleet is not None:
            store["fleet"] = self.fleet.report()
        probed = self.probes.start_up_done()
        return {
            "ready": any(state == "ok" for state in backends.values())
            and self.store.health.serving
            and probed
            and not self.drain.draining,
            "start_up_probes": {"done": probed, "routes_waiting": self.probes.start_up_waiting_for()},
            "draining": self.drain.draining,
            "pid": os.getpid(),  # which worker answered, with ``serve --workers``
            "in_flight": {
                "now": self.in_flight.count,
                "limit": policy.server.max_in_flight,
                "peak": self.in_flight.peak,
                "shed": self.in_flight.shed,
            },
            "policy": {"source": policy.source, "digest": policy.digest[:12]},
            "backends": backends,
            "store": store,
        }

    def decide(
        self,
        policy: CompiledPolicy,
        route: CompiledRoute,
        prompt_tokens: int,
        max_tokens: int | None,
        stream: bool,
        keys: PromptKeys = NO_KEYS,
    ) -> Decision:
        features = self.prefixes.features(route, prompt_tokens, max_tokens, stream, keys)
        snapshot = self.stats.snapshot(route.backends)
        return decide(features, route, policy, snapshot, self.rng, self._decision_memo)

    def authenticate(self, policy: CompiledPolicy, headers: Headers) -> ApiKey | None:
        keys = policy.api_keys
        if not keys and self.require_keys:
            raise AuthenticationFailed("this gateway listens beyond loopback and its policy has no API keys")
        return authenticate(keys, headers)

    def authorize_admin(self, headers: Headers) -> None:
        key = self.authenticate(self.policy, headers)
        if key is not None and not key.admin:
            raise PermissionDenied(f"the API key '{key.name}' is not an admin key", code="admin_only")

    def new_request_id(self) -> str:
        return f"{self._request_id_prefix}{next(self._request_ids):012x}"

    def explain(
        self, route: CompiledRoute, prompt_tokens: int, max_tokens: int | None, cache_key: str | None = None
    ) -> Decision:
        """The decision a request would get now, without the exploration draw and without sending it;
        with ``cache_key``, for the next turn of that conversation (what its client key says is held)."""
        features = self.prefixes.features(route, prompt_tokens, max_tokens, True, cache_key=cache_key)
        return decide(features, route, self.policy, self.stats.snapshot(route.backends), NeverExplore())

    def allows(self, backend: str) -> bool:
        """A fallback re-checks the circuit: it may have opened since the decision."""
        return self.stats.allows_request(backend)

    def attempt_finished(
        self, policy: CompiledPolicy, observation: Observation, attempt: Attempt, ticket: AttemptTicket
    ) -> None:
        """One attempt ended: it teaches the live stats (and the fleet) and adds its cost."""
        self.stats.attempt_finished(ticket, attempt, observation.route)
        self.waiting.notify()
        if self.fleet is not None:
            self.fleet.attempt_finished(attempt, observation.route)
        if attempt.usage is not None:
            if attempt.cost_usd is None:
                self._price(policy, attempt, attempt.usage)
            observation.cost_usd = (observation.cost_usd or 0.0) + (attempt.cost_usd or 0.0)
            observation.cost_basis = attempt.cost_basis
            if attempt.prefill_cost_usd is not None:
                observation.prefill_cost_usd = (
                    observation.prefill_cost_usd or 0.0
                ) + attempt.prefill_cost_usd

    def error_returned(self, error: GatewayError) -> None:
        origin = "upstream" if isinstance(error, (UpstreamError, UpstreamClientError)) else "gateway"
        self.errors_returned[(origin, error.code or error.type)] += 1

    def rate_limited(self, backend: str, retry_after: str | None) -> None:
        """An upstream 429: pause ``backend`` until its Retry-After (backpressure, not a failure)."""
        self.stats.pause(backend, self.clock() + retry_after_seconds(retry_after, self.wall_clock()))

    async def wait_for_candidate(
        self,
        policy: CompiledPolicy,
        route: CompiledRoute,
        observation: Observation,
        features: RequestFeatures,
        deadline: float,
        keys: PromptKeys = NO_KEYS,
    ) -> Decision:
        """No candidate can take the request now (all full or rate-limited): wait in the route's queue
        for the first that frees, within the route's bound and by ``deadline``; past it ``BackendsBusy``
        (429). Returns the new decision."""

        def redecide() -> Decision:
            return self.decide(
                policy, route, features.prompt_tokens, features.max_tokens, features.stream, keys
            )

        def retry_after_s() -> float:
            paused = [self.stats.paused_for(name) for name in route.backends]
            return min((p for p in paused if p > 0), default=1.0)

        decision, waited = await self.waiting.wait(
            route, deadline, route.waiting.max_wait_s - observation.queued_s, redecide, retry_after_s
        )
        observation.queued_s += waited
        observation.decision_reason = f"{decision.reason}_after_wait"
        observation.expected_cost_usd = decision.expected_cost_usd
        return decision
