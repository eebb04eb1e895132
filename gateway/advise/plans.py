"""A capacity plan and its replay: each pool's replicas (fixed, or up and down on a schedule) become
backends of a policy copy, the schedule becomes faults on the timeline (booting, draining, off), and
the simulator replays the traffic through the gateway's own decision; the plan is charged each
replica's paid hours (boot and drain included) plus what the API was paid."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.advise.schedule import DRAIN_S, UpSpell
from gateway.advise.traffic import PoolModel
from gateway.money.costs import SECONDS_PER_HOUR
from gateway.policy.compiled import CompiledPolicy, CompiledRoute
from gateway.policy.decide import Decision, RequestFeatures
from gateway.simulate.engine import RunResult, Simulation, policy_router_decide
from gateway.simulate.report import summarize
from gateway.simulate.workload import Fault, Workload


@dataclass(frozen=True, slots=True)
class Plan:
    """Per pool, per replica (1-based order), the spells it is up; always-on is one spell, the run."""

    name: str
    spells: Mapping[str, list[list[UpSpell]]]
    label: str  # "b300-vllm 2, a100-llamacpp 0", or the schedule's range

    def replicas(self, pool: str) -> int:
        return len(self.spells.get(pool, []))


def fixed_plan(name: str, replicas: Mapping[str, int], duration_s: float) -> Plan:
    always = [UpSpell(0.0, 0.0, duration_s, duration_s)]
    spells = {pool: [always for _ in range(n)] for pool, n in replicas.items()}
    return Plan(name, spells, ", ".join(f"{pool} {n}" for pool, n in replicas.items()))


def replica_name(pool: str, replica: int) -> str:
    return pool if replica == 1 else f"{pool}-{replica}"


def materialize(policy: CompiledPolicy, workload: Workload, plan: Plan) -> tuple[CompiledPolicy, Workload]:
    """The policy with each pool replaced by its replicas (in the pool's place in every route), and
    the workload with the plan's off, booting and draining spells as faults."""
    backends = dict(policy.backends)
    models = dict(workload.backends)
    names: dict[str, list[str]] = {}
    faults = [f for f in workload.faults if f.backend not in plan.spells]
    for pool, replicas in plan.spells.items():
        original = backends.pop(pool)
        names[pool] = []
        for index, spells in enumerate(replicas, start=1):
            name = replica_name(pool, index)
            backends[name] = dataclasses.replace(original, name=name)
            if pool in workload.backends:
                models[name] = workload.backends[pool]
            names[pool].append(name)
            faults += replica_faults(name, spells, workload.duration_s)
        faults += [f for f in workload.faults if f.backend == pool and names[pool]]
    routes = {
        name: dataclasses.replace(route, backends=tuple(n for b in route.backends for n in names.get(b, [b])))
        for name, route in policy.routes.items()
    }
    plan_policy = dataclasses.replace(policy, backends=backends, routes=routes)
    return plan_policy, workload._replace(backends=models, faults=tuple(faults))


def replica_faults(name: str, spells: list[UpSpell], duration_s: float) -> list[Fault]:
    """Off before its boot and after its drain, booting (503, health says loading) until ready,
    refusing new streams while it drains the ones it holds."""
    faults: list[Fault] = []
    at = 0.0
    for s in spells:
        if s.paid_from_s > at:
            faults.append(Fault(backend=name, kind="down", start_s=at, end_s=s.paid_from_s))
        if s.ready_s > s.paid_from_s:
            faults.append(Fault(backend=name, kind="booting", start_s=s.paid_from_s, end_s=s.ready_s))
        if s.paid_until_s > s.stop_s:
            faults.append(Fault(backend=name, kind="errors", start_s=s.stop_s, end_s=s.paid_until_s))
        at = s.paid_until_s
    if at < duration_s:
        faults.append(Fault(backend=name, kind="down", start_s=at, end_s=duration_s + DRAIN_S))
    return faults


class StartupProbed:
    """The gateway's own decision, with a pool replica that came up unmeasured tried first once: the
    running gateway's prober measures a backend as soon as it is healthy, which the simulator does not
    model; without it a booted replica would never be chosen over a measured API."""

    def __init__(self, name: str, policy: CompiledPolicy) -> None:
        self.name = name
        self._pools = {n for n, b in policy.backends.items() if b.pool_price is not None}

    def decide(self, sim: Simulation, features: RequestFeatures, route: CompiledRoute) -> Decision:
        decision = policy_router_decide(sim, features, route)
        for name in route.backends:
            if name in self._pools and sim.models[name].healthy and self._unmeasured(sim, name):
                order = (name, *(n for n in decision.order if n != name))
                return Decision(order, decision.reason, lambda: decision.evals)
        return decision

    @staticmethod
    def _unmeasured(sim: Simulation, name: str) -> bool:
        return sim.stats.view(name).samples == 0 and sim.stats.local_inflight(name) == 0


@dataclass(frozen=True, slots=True)
class PlanResult:
    plan: Plan
    total_usd: float
    pool_usd: Mapping[str, float]
    api_usd: float
    usd_per_day: float
    usd_per_mtok: float | None
    slo_attainment: float
    share: Mapping[str, float]  # by pool (replicas together) and API backend
    idle_gpu_hours: float
    output_tokens: int
    requests: int
    failures: int

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.plan.name,
            "capacity": self.plan.label,
            "replicas": {pool: self.plan.replicas(pool) for pool in self.plan.spells},
            "total_usd": self.total_usd,
            "usd_per_day": self.usd_per_day,
            "usd_per_mtok_out": self.usd_per_mtok,
            "slo_attainment": self.slo_attainment,
            "pool_usd": dict(self.pool_usd),
            "api_usd": self.api_usd,
            "share": dict(self.share),
            "idle_gpu_hours": self.idle_gpu_hours,
            "requests": self.requests,
            "failures": self.failures,
        }


def run_plan(
    policy: CompiledPolicy, workload: Workload, plan: Plan, pools: list[PoolModel], seed: int = 0
) -> PlanResult:
    plan_policy, plan_workload = materialize(policy, workload, plan)
    router = StartupProbed(plan.name, plan_policy)
    result = Simulation(plan_policy, plan_workload, router, seed=seed).run()
    return price(result, plan, pools, workload.duration_s)


def price(result: RunResult, plan: Plan, pools: list[PoolModel], duration_s: float) -> PlanResult:
    """The plan's bill: each replica's paid hours, the API's tokens; idle GPU hours are paid hours
    no stream used, at a full replica's throughput."""
    summary = summarize(result)
    pool_of = {replica_name(p, i): p for p, spells in plan.spells.items() for i in range(1, len(spells) + 1)}
    by_pool = {p.name: p for p in pools}
    pool_usd: dict[str, float] = {}
    idle = 0.0
    tokens: dict[str, int] = {}
    for o in result.outcomes:
        if o.ok and o.backend in pool_of:
            tokens[pool_of[o.backend]] = tokens.get(pool_of[o.backend], 0) + o.output_tokens
    for pool, replicas in plan.spells.items():
        paid_s = sum(s.paid_until_s - s.paid_from_s for spells in replicas for s in spells)
        model = by_pool[pool]
        pool_usd[pool] = paid_s / SECONDS_PER_HOUR * model.shape.usd_per_hour
        full = model.shape.streams * model.shape.stream_tokens_per_s
        idle += max(0.0, paid_s - tokens.get(pool, 0) / full) / SECONDS_PER_HOUR
    api = sum(result.api_usd.values())
    total = sum(pool_usd.values()) + api
    share: dict[str, float] = {}
    for name, value in summary["share"].items():
        key = pool_of.get(name, name)
        share[key] = share.get(key, 0.0) + value
    output = summary["output_tokens"]
    return PlanResult(
        plan=plan,
        total_usd=total,
        pool_usd=pool_usd,
        api_usd=api,
        usd_per_day=total / (duration_s / 86_400.0),
        usd_per_mtok=total / output * 1e6 if output else None,
        slo_attainment=summary["slo_attainment"] or 0.0,
        share=share,
        idle_gpu_hours=idle,
        output_tokens=output,
        requests=summary["requests"],
        failures=summary["failures"],
    )
