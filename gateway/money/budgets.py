"""Spending caps per route (per API key once keys exist), per UTC day and month: admission reserves a
request's predicted cost, its end settles the reservation with the ledger's real cost.

So concurrent requests can overspend a cap by no more than what their reservations under-predicted.
Counters live in the ``Store`` (in memory, or in Redis, where replicas share them).
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, NamedTuple

from gateway.errors import GatewayError
from gateway.ledger import LedgerDatabase, LedgerUnavailable
from gateway.money.costs import amortized_expected_cost
from gateway.policy.compiled import CompiledBackend, CompiledPolicy, CompiledRoute
from gateway.policy.decide import CandidateEval, Decision
from gateway.policy.schema import Budgets as BudgetLimits
from gateway.store import ADMITTED, Ask, Store, Verdict, WindowCharge
from gateway.store.memory import MemoryStore
from gateway.values.observation import Observation

Period = Literal["day", "month"]
Scope = Literal["route", "key"]
PERIODS: tuple[Period, ...] = ("day", "month")
ADJECTIVES: Mapping[Period, str] = MappingProxyType({"day": "daily", "month": "monthly"})


class BudgetExhausted(GatewayError):
    """A cap cannot cover the request: 429, in the shape OpenAI uses for an exhausted quota."""

    status = 429
    type = "insufficient_quota"
    code = "budget_exhausted"
    refusal = True

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


# The embedded store under the name budgets had before stores were shared (its tests use it).
MemoryBudgetStore = MemoryStore


class Cap(NamedTuple):
    """One limit that applies to a request: e.g. route 'kimi-k3', day, $50."""

    scope: Scope
    name: str
    period: Period
    limit_usd: float
    on_exhausted: str


class BudgetUse(NamedTuple):
    scope: Scope
    name: str
    period: Period
    limit_usd: float
    spent_usd: float
    reserved_usd: float

    @property
    def remaining_usd(self) -> float:
        return self.limit_usd - self.spent_usd - self.reserved_usd


@dataclass(frozen=True, slots=True)
class Reservation:
    keys: tuple[str, ...]
    amount: float
    wall: float  # when it was admitted: the day and month its cost belongs to
    held_in: int = 0  # where the store holds it (see Verdict.held_in)


def period_id(period: Period, wall: float) -> str:
    """``2026-12`` (month) or ``2026-12-02`` (day), UTC; every request settles two or four of these."""
    day = _day_ids(int(wall // 86_400))
    return day[1] if period == "day" else day[0]


@functools.lru_cache(maxsize=8)
def _day_ids(day: int) -> tuple[str, str]:
    """The month and day ids of the UTC day ``day`` (days since the epoch), built once per day."""
    t = time.gmtime(day * 86_400)
    month = f"{t.tm_year:04d}-{t.tm_mon:02d}"
    return month, f"{month}-{t.tm_mday:02d}"


def period_bounds(period: Period, wall: float) -> tuple[float, float]:
    """Start and end (Unix seconds) of the UTC day or month holding ``wall``."""
    t = time.gmtime(wall)
    if period == "day":
        start = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
        return float(start), float(start + 86_400)
    start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(start), float(calendar.timegm((year, month, 1, 0, 0, 0)))


def counter_key(scope: Scope, name: str, period: Period, wall: float) -> str:
    return f"budget:{scope}:{name}:{period}:{period_id(period, wall)}"


def caps_of(scope: Scope, name: str, limits: BudgetLimits | None) -> list[Cap]:
    if limits is None:
        return []
    by_period = {"day": limits.per_day_usd, "month": limits.per_month_usd}
    return [
        Cap(scope, name, period, limit, limits.on_exhausted)
        for period in PERIODS
        if (limit := by_period[period]) is not None
    ]


def reservation_usd(evaluation: CandidateEval, backend: CompiledBackend) -> float:
    """What to reserve for a candidate: what the ledger will likely charge (see costs)."""
    return amortized_expected_cost(
        backend,
        evaluation.usd_per_mtok_out,
        evaluation.predicted_output_tokens,
        evaluation.expected_cost_usd or 0.0,
    )


class Budgets:
    """Admission and settlement against every cap that applies to a request."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def caps(self, policy: CompiledPolicy, route: CompiledRoute, api_key_name: str | None) -> list[Cap]:
        """The route's caps and the calling key's: a request must fit under all of them."""
        caps = caps_of("route", route.name, route.budgets)
        if api_key_name is not None:
            caps += caps_of("key", api_key_name, policy.key_budgets.get(api_key_name))
        return caps

    async def admit(
        self,
        observation: Observation,
        route: CompiledRoute,
        decision: Decision,
        policy: CompiledPolicy,
        wall: float,
        windows: Sequence[WindowCharge] = (),
    ) -> tuple[tuple[str, ...], Verdict, Reservation | None]:
        """The backends this request may try, the store's verdict and the reservation the request now
        holds (settle it with ``settle``); BudgetExhausted if no candidate fits.

        The reservation covers the dearest backend the request may end on, fallbacks included; when
        that does not fit, dearer fallbacks are dropped, and with ``fallback_cheaper`` so is the chosen
        backend, down to the cheapest candidate that fits. ``windows`` (rate limits) are charged in the
        same atomic step; when one refuses, the verdict says so and nothing is reserved.
        """
        caps = self.caps(policy, route, observation.api_key_name)
        order = decision.order
        if not caps and not windows:
            return order, ADMITTED, None
        costs = {e.backend: reservation_usd(e, policy.backends[e.backend]) for e in decision.evals}
        cheaper_allowed = all(c.on_exhausted == "fallback_cheaper" for c in caps)
        levels = tuple(
            level
            for level in sorted({costs[b] for b in order}, reverse=True)
            if cheaper_allowed or level >= costs[order[0]]
        )
        keys = tuple(counter_key(c.scope, c.name, c.period, wall) for c in caps)
        ask = Ask(tuple(windows), keys, tuple(c.limit_usd for c in caps), levels if caps else ())
        verdict = await self.store.admit(ask)
        if verdict.status == "limited":
            return (), verdict, None
        if verdict.status == "exhausted":
            raise self._exhausted(caps, wall, costs[order[0]])
        if not caps:
            return order, verdict, None
        level = levels[verdict.level]
        allowed = tuple(b for b in order if costs[b] <= level)
        if allowed[0] != order[0]:
            observation.decision_reason = "budget_fallback_cheaper"
        return allowed, verdict, Reservation(keys, level, wall, verdict.held_in)

    def settle(self, reservation: Reservation | None, observation: Observation, started_wall: float) -> None:
        """Count the request's real cost under every counter of its route (and key), releasing its
        reservation. Every request is counted, capped or not, so a cap added by a policy reload
        starts from the period's true spend."""
        actual = observation.cost_usd or 0.0
        # Counted in the periods it was admitted in, even if it ends after midnight.
        wall = started_wall if reservation is None else reservation.wall
        scopes: list[tuple[Scope, str]] = [("route", observation.route)]
        if observation.api_key_name is not None:
            scopes.append(("key", observation.api_key_name))
        keys = [counter_key(scope, name, period, wall) for scope, name in scopes for period in PERIODS]
        if reservation is None:
            self.store.settle(keys, 0.0, actual)
            return
        self.store.settle(reservation.keys, reservation.amount, actual, reservation.held_in)
        # Counters without a cap took no reservation: they only count (releasing one would free
        # another request's reservation).
        uncapped = [key for key in keys if key not in reservation.keys]
        if uncapped:
            self.store.settle(uncapped, 0.0, actual)

    def usage(self, policy: CompiledPolicy, wall: float) -> list[BudgetUse]:
        """Every cap in the policy with its counters now: for metrics and the dashboard."""
        caps = [
            cap for route in policy.routes.values() for cap in caps_of("route", route.name, route.budgets)
        ]
        caps += [cap for name, limits in policy.key_budgets.items() for cap in caps_of("key", name, limits)]
        uses = []
        for cap in caps:
            spent, reserved = self.store.read(counter_key(cap.scope, cap.name, cap.period, wall))
            uses.append(BudgetUse(cap.scope, cap.name, cap.period, cap.limit_usd, spent, reserved))
        return uses

    async def seed(self, ledger: LedgerDatabase, wall: float) -> None:
        """Start this period's counters from the ledger, so a restart does not reset spend to zero
        (a shared ledger's totals are the fleet's)."""
        totals = await asyncio.to_thread(_period_totals, ledger, wall)
        for key, spent in totals.items():
            self.store.seed(key, spent)
        # A store that can lose its counters (Redis restarted empty) raises them to the ledger's again.
        self.store.reseed_from(functools.partial(_period_totals, ledger), ledger.shared)

    async def close(self) -> None:
        await self.store.close()

    def _exhausted(self, caps: Sequence[Cap], wall: float, needed: float) -> BudgetExhausted:
        worst: tuple[Cap, float, float] | None = None
        for cap in caps:
            spent, reserved = self.store.read(counter_key(cap.scope, cap.name, cap.period, wall))
            if worst is None or spent + reserved - cap.limit_usd > worst[1] + worst[2] - worst[0].limit_usd:
                worst = (cap, spent, reserved)
        assert worst is not None  # admission only fails when some cap applies
        cap, spent, reserved = worst
        resets_at = period_bounds(cap.period, wall)[1]
        reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resets_at))
        message = (
            f"the {ADJECTIVES[cap.period]} budget of {cap.scope} '{cap.name}' is exhausted: ${spent:.4f} of "
            f"${cap.limit_usd:.4f} spent and ${reserved:.4f} reserved by requests in flight; this request "
            f"needs about ${needed:.4f}. The budget resets at {reset}."
        )
        return BudgetExhausted(message, max(1, int(resets_at - wall)))


def _period_totals(ledger: LedgerDatabase, wall: float) -> Mapping[str, float]:
    totals: dict[str, float] = {}
    try:
        with ledger.reading() as reader:
            for period in PERIODS:
                start, _ = period_bounds(period, wall)
                scopes: tuple[Scope, ...] = ("route", "key")
                for scope in scopes:
                    for row in reader.totals(scope, start):
                        if row.key is not None:
                            totals[counter_key(scope, row.key, period, wall)] = row.cost_usd
    except LedgerUnavailable:
        return {}  # no ledger yet: nothing spent
    return totals
