"""Redis restarted empty under load (our own server, by pid; a shared PostgreSQL ledger): the fleet
keeps answering, the dashboard says it is degraded while Redis is away, a budget near its end is
overspent by no more than ``gateway.store.outage`` says, and once Redis is back its counter is
raised to the ledger's total: it never holds less than the ledger, and more only by the bounded double
count ``gateway.store.outage`` describes (which makes a budget refuse early, never late)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gateway.money.budgets import counter_key
from tests.conftest import Upstreams, policy_yaml
from tests.postgres import scratch_database, url_of

from .conftest import auth_yaml, counter, eventually, key_prefix, redis_server, start_replicas, stop_replicas
from .test_outage import Load, slow_paid

__all__ = ["slow_paid"]  # the fixture, shared with the outage tests
CLIENTS = 6  # one request in flight each at most


def policy(upstreams: Upstreams, prefix: str, per_day_usd: float) -> str:
    routes = f"""
  paid-counted:
    backends: [paid-api]
    budgets: {{per_day_usd: {per_day_usd!r}}}
"""
    store = f"store: {{key_prefix: '{prefix}', sync_interval_s: 0.2, on_failure: fail_open}}\n"
    return policy_yaml(upstreams, routes) + auth_yaml() + "ledger: {flush_interval_s: 0.05}\n" + store


def ledger_spend(url: str) -> tuple[int, float, float]:
    """Rows answered, their spend and the dearest one's, as the fleet's ledger holds them."""
    with psycopg.connect(url, connect_timeout=5) as db:
        query = "SELECT count(*), sum(cost_usd), max(cost_usd) FROM requests WHERE status = 'ok'"
        count, total, dearest = db.execute(query).fetchone() or (0, 0.0, 0.0)
    return int(count), float(total or 0.0), float(dearest or 0.0)


def outcome(status: int | None, body: str) -> str:
    if status == 429 and "budget_exhausted" in body:
        return "refused: budget"
    streamed_ok = body.rstrip().endswith("data: [DONE]") and '"error"' not in body
    if status == 200 and (streamed_ok or (body.startswith("{") and '"choices"' in body)):
        return "answered"
    return f"failed: {status} {body[-200:]}"


@pytest.fixture
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("redis-restart")


@pytest.fixture
def fleet_ledger() -> Iterator[str]:
    with scratch_database() as database:
        yield url_of(database)


def test_redis_restarted_empty_under_load_keeps_the_budget_within_its_bound(
    upstreams: Upstreams, workdir: Path, fleet_ledger: str, slow_paid: None
) -> None:
    prefix = key_prefix()
    path = workdir / "policy.yaml"
    path.write_text(policy(upstreams, prefix, 1000.0))
    with redis_server(workdir) as redis:
        replicas = start_replicas(path, redis.url, workdir, 2, ledger_url=fleet_ledger)
        load = Load(replicas, CLIENTS)
        try:
            load.wait_for(12)
            # The cap: what is spent now and about 25 more requests; reloaded under load.
            _, spent, dearest = ledger_spend(fleet_ledger)
            limit = spent + 25 * dearest
            digests = [r.ready()["policy"]["digest"] for r in replicas]
            path.write_text(policy(upstreams, prefix, limit))
            eventually(
                lambda: all(
                    r.ready()["policy"]["digest"] != d for r, d in zip(replicas, digests, strict=True)
                )
            )

            redis.stop()  # the store goes with requests in flight ...
            eventually(lambda: not replicas[0].ready()["store"]["up"])
            degraded = replicas[0].get("/dashboard/data").json()["degraded"]
            assert any("shared store unreachable" in reason for reason in degraded), degraded
            redis.start()  # ... and comes back on the same port, empty

            def refused_enough() -> bool:
                return sum(outcome(*r) == "refused: budget" for r in load.results) >= 12

            eventually(refused_enough, timeout=90)  # the cap is reached: the budget refuses
        finally:
            results = load.stop()
        try:
            kinds = [outcome(*r) for r in results]
            assert all(k in ("answered", "refused: budget") for k in kinds), [
                k for k in kinds if k.startswith("failed")
            ][:3]
            answered = kinds.count("answered")
            eventually(lambda: ledger_spend(fleet_ledger)[0] == answered, timeout=30)
            _, spent, dearest = ledger_spend(fleet_ledger)
            # gateway.store.outage's bound: each request in flight when Redis lost its reservations,
            # and each answered whose ledger row was not yet written when the counters were raised.
            bound = 2 * CLIENTS * dearest
            assert spent - limit <= bound, f"overspent by ${spent - limit:.6f}, bound ${bound:.6f}"
            assert all(r.ready()["store"]["up"] for r in replicas)
            assert not replicas[1].get("/dashboard/data").json()["degraded"], "the banner clears"

            key = counter_key("route", "paid-counted", "day", time.time())

            def reconciled() -> bool:
                """The counter holds at least what the ledger holds, and at most the double count that
                gateway.store.outage allows: a raise to the ledger's total takes in rows whose settlements
                another replica had not yet sent, and they are added again when it sends them."""
                with redis.client() as client:
                    shared, reserved = counter(client, prefix, key)
                assert reserved == pytest.approx(0, abs=1e-9)
                assert spent * (1 - 1e-9) <= shared <= spent + 2 * CLIENTS * dearest, (shared, spent, dearest)
                return True

            eventually(reconciled, timeout=30)
            stores = [r.ready()["store"] for r in replicas]
            assert sum(s["data_lost"] for s in stores) >= 1, stores
        finally:
            stop_replicas(replicas)
        for replica in replicas:
            text = replica.log.read_text()
            assert "Traceback" not in text, text[-2000:]
