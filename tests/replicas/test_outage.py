"""Redis stopped mid-run (our own server, by pid): fail-open replicas serve every request on local
counts and say so on /ready and /metrics, a fail-closed one answers 503; when Redis is back (same
port, empty) the shared counter catches up with everything the ledgers served, exactly once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from gateway.money.budgets import counter_key
from tests.conftest import Upstreams, policy_yaml

from .conftest import (
    ADMIN_KEY,
    HELLO,
    RedisServer,
    Replica,
    auth_yaml,
    counter,
    eventually,
    key_prefix,
    ledger_rows,
    redis_server,
    start_replicas,
    stop_replicas,
)

ROUTES = """
  paid-counted:
    backends: [paid-api]
    budgets: {per_day_usd: 100.0}
"""


@dataclass
class Outage:
    redis: RedisServer
    prefix: str
    open: list[Replica]  # on_failure: fail_open
    closed: Replica  # on_failure: fail_closed


@pytest.fixture
def outage(upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    upstreams.reset()
    tmp = tmp_path_factory.mktemp("outage")
    prefix = key_prefix()
    base = policy_yaml(upstreams, ROUTES) + auth_yaml() + "ledger: {flush_interval_s: 0.05}\n"
    store = f"store: {{key_prefix: '{prefix}', sync_interval_s: 0.2, on_failure: %s}}\n"
    (tmp / "open.yaml").write_text(base + store % "fail_open")
    (tmp / "closed.yaml").write_text(base + store % "fail_closed")
    with redis_server(tmp) as server:
        replicas = start_replicas(tmp / "open.yaml", server.url, tmp, 2)
        (closed,) = start_replicas(tmp / "closed.yaml", server.url, tmp_path_factory.mktemp("closed"), 1)
        try:
            yield Outage(server, prefix, replicas, closed)
        finally:
            stop_replicas([*replicas, closed])


def chat(replica: Replica) -> httpx.Response:
    body = {"model": "paid-counted", "messages": HELLO, "max_tokens": 8}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.post(replica.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def metric(replica: Replica, name: str) -> float:
    for line in replica.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def test_redis_stopped_mid_run_costs_no_request_and_the_counters_catch_up(outage: Outage) -> None:
    everyone = [*outage.open, outage.closed]
    for replica in everyone * 2:
        assert chat(replica).status_code == 200
    key = counter_key("route", "paid-counted", "day", time.time())

    def spent_in_ledgers() -> float:
        return sum(row["cost_usd"] for r in everyone for row in ledger_rows(r.ledger, "status = 'ok'"))

    def counter_matches(expected_rows: int) -> bool:
        rows = sum(len(ledger_rows(r.ledger, "status = 'ok'")) for r in everyone)
        with outage.redis.client() as client:
            spent = counter(client, outage.prefix, key)[0]
        return rows == expected_rows and spent == pytest.approx(spent_in_ledgers(), rel=1e-9)

    eventually(lambda: counter_matches(6))

    outage.redis.stop()
    served = [chat(replica) for replica in outage.open * 6]
    assert [r.status_code for r in served] == [200] * 12, "fail-open: no request failed"
    refused = chat(outage.closed)
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "store_unavailable" and "fail_closed" in error["message"]
    for replica in outage.open:
        ready = replica.get("/ready")
        assert ready.status_code == 200, "fail-open keeps the replica in the load balancer"
        store = ready.json()["store"]
        assert store["up"] is False and store["fault"] == "cannot connect to Redis" and store["faults"] >= 1
        assert str(outage.redis.port) not in store["fault"], "the fault names no address"
        assert metric(replica, "gateway_store_up") == 0
        assert metric(replica, "gateway_store_faults_total") >= 1
    closed_ready = outage.closed.get("/ready")
    assert closed_ready.status_code == 503 and closed_ready.json()["ready"] is False

    outage.redis.start()  # the same port, and empty: what was sent before the outage is gone too

    def all_back() -> bool:
        return all(r.ready()["store"]["up"] for r in everyone)

    eventually(all_back)
    eventually(lambda: counter_matches(18))
    assert chat(outage.closed).status_code == 200, "fail-closed serves again once Redis is back"
    for replica in outage.open:
        assert metric(replica, "gateway_store_up") == 1
