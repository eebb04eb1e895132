"""The runtime's books: what a request may spend and what it did. ``admit`` reserves its predicted cost
against its budgets and charges its key's rate limits, in one step of the store; an attempt is priced
(``cost_so_far`` while a stream still runs, for the client's usage object); ``settle`` closes the books
once: reservations released at the real cost, the ledger row, the live spend, the metrics. Spend and
budgets carry over a restart, seeded from the ledger at start-up.

``Books`` is part of ``Runtime`` (``runtime/__init__.py``), which builds every object named below.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from gateway.ledger import Ledger, row_of
from gateway.measure.demand import DemandSignal
from gateway.measure.prefix_index import NO_KEYS, PromptKeys
from gateway.measure.prefixes import Prefixes
from gateway.measure.stats import LiveStats
from gateway.metrics import GatewayMetrics
from gateway.money.budgets import Budgets, Reservation
from gateway.money.costs import attempt_cost
from gateway.money.ratelimit import HeldTokens, RateLimits
from gateway.money.spend import SpendTally, seed_tally
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision
from gateway.store import Store
from gateway.values.observation import Attempt, Observation, Usage


class Books:
    """The request's money and its record, from admission to settlement; what it reads of the runtime is
    declared here."""

    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    stats: LiveStats
    store: Store
    budgets: Budgets
    rate_limits: RateLimits
    demand: DemandSignal
    prefixes: Prefixes
    ledger: Ledger
    replica: str
    spend: SpendTally
    recent: deque[Observation]
    metrics: GatewayMetrics
    request_listeners: list[Callable[[Observation], None]]

    async def admit(
        self,
        policy: CompiledPolicy,
        route: CompiledRoute,
        observation: Observation,
        decision: Decision,
        prompt_tokens: int,
    ) -> tuple[tuple[str, ...], Reservation | None, HeldTokens | None]:
        """Reserve the request's predicted cost against its budgets and charge its key's rate limits,
        in one step of the store; returns the backends it may try and what was reserved, which the
        request holds until it settles (nothing is held when this raises)."""
        if not self.store.health.serving:
            raise self.store.health.unavailable()
        charges = self.rate_limits.charges(observation, prompt_tokens, decision, policy)
        order, verdict, budget = await self.budgets.admit(
            observation, route, decision, policy, self.wall_clock(), charges
        )
        if verdict.status == "limited":
            raise self.rate_limits.refused(verdict, charges, observation.api_key_name or "")
        self.demand.arrived(observation.route)
        return order, budget, self.rate_limits.held(charges, verdict)

    def cost_so_far(
        self, policy: CompiledPolicy, observation: Observation, attempt: Attempt, usage: Usage
    ) -> tuple[float, str | None]:
        """What the request has cost with ``attempt`` at its final ``usage``, for the client's usage
        object; the attempt keeps that price, so the ledger says the same."""
        self._price(policy, attempt, usage, streaming=True)
        return (observation.cost_usd or 0.0) + (attempt.cost_usd or 0.0), attempt.cost_basis

    def _price(
        self, policy: CompiledPolicy, attempt: Attempt, usage: Usage, *, streaming: bool = False
    ) -> None:
        backend = policy.backends[attempt.backend]
        if backend.pool_price is None:  # a list price: what the pool has measured does not matter
            cost = attempt_cost(backend, usage, None)
            attempt.cost_usd, attempt.cost_basis, attempt.prefill_cost_usd = cost.usd, cost.basis, None
            return
        view = self.stats.view(attempt.backend)
        throughput = view.aggregate_tokens_per_s
        if throughput is None and streaming and attempt.ttft_s is not None and usage.completion_tokens > 1:
            # Priced before the attempt has fed the stats (the client's usage chunk): a pool nothing
            # has measured yet is priced at this stream's own decode speed, as the stats would have it.
            decoding = self.clock() - attempt.started_at - attempt.ttft_s
            throughput = (usage.completion_tokens - 1) / decoding if decoding > 0 else None
        cost = attempt_cost(backend, usage, throughput, view.prefill_tokens_per_s)
        attempt.cost_usd, attempt.cost_basis = cost.usd, cost.basis
        attempt.prefill_cost_usd = cost.prefill_usd

    async def _start_spend(self) -> None:
        await self.ledger.start()
        # Today's spend and this period's budget counters carry over a restart, from the ledger.
        await asyncio.to_thread(seed_tally, self.spend, self.ledger.database, self.wall_clock())
        await self.budgets.seed(self.ledger.database, self.wall_clock())

    def settle(
        self,
        policy: CompiledPolicy,
        observation: Observation,
        budget: Reservation | None,
        tokens: HeldTokens | None,
        keys: PromptKeys = NO_KEYS,
        *,
        count: bool = True,
    ) -> None:
        """Close the books on a finished request: its reservations, ledger row, live spend, metrics (unless
        not ``count``: the caller gives the observation to ``metrics.request_finished`` itself)."""
        started_wall = self.wall_clock() - (self.clock() - observation.started_at)
        self.budgets.settle(budget, observation, started_wall)
        self.rate_limits.settle(tokens, observation)
        self.prefixes.remember(keys, observation)
        backend = policy.backends.get(observation.backend or "")
        reserved = None if budget is None else budget.amount
        row = row_of(
            observation, started_wall, None if backend is None else backend.model, reserved, self.replica
        )
        self.ledger.append(row)
        if observation.route:  # a request refused before naming a route has no spend to show
            self.spend.add(started_wall, observation.route, row.cost_usd)
        self.recent.append(observation)
        if count:
            self.metrics.request_finished(observation)
        final = observation.final
        if final is not None and final.usage is not None:
            self.demand.finished(observation.route, final.usage.completion_tokens)
        for listener in self.request_listeners:
            listener(observation)
