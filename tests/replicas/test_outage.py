"""Redis stopped mid-run (our own server, by pid): fail-open replicas serve every request on local
counts and say so on /ready and /metrics, a fail-closed one answers 503; when Redis is back (same
port, empty) the shared counter catches up with everything the ledgers served, exactly once. The same
with requests in flight: Redis SIGKILLed under load, and Redis hung (SIGSTOP, then SIGCONT)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import orjson
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
    # The gauge follows the store's health; on a loaded machine a command can still time out (100 ms),
    # a real fault reported as one, so it is read until it says up again.
    for replica in outage.open:
        eventually(lambda replica=replica: metric(replica, "gateway_store_up") == 1)


# --- faults with requests in flight ----------------------------------------------------------------

REQUEST_TIMEOUT_S = 30.0  # the client's bound: a request stuck behind a hung Redis would meet it


def ask(replica: Replica, stream: bool) -> tuple[int | None, str]:
    """One chat request, streamed or not: its status and body, or no status and the client's error."""
    body = {"model": "paid-counted", "messages": HELLO, "max_tokens": 40, "stream": stream}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    url = replica.url + "/v1/chat/completions"
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status_code, response.read().decode(errors="replace")
    except httpx.HTTPError as exc:
        return None, repr(exc)


class Load:
    """Clients sending requests (half of them streamed) to the replicas, one at a time each, until
    stopped: each request's answer is kept."""

    def __init__(self, replicas: list[Replica], clients: int = 6) -> None:
        self.results: list[tuple[int | None, str]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(replicas[i % len(replicas)], i % 2 == 0), daemon=True)
            for i in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _client(self, replica: Replica, stream: bool) -> None:
        while not self._stop.is_set():
            self.results.append(ask(replica, stream))

    def wait_for(self, count: int) -> None:
        eventually(lambda: len(self.results) >= count, timeout=60)

    def stop(self) -> list[tuple[int | None, str]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self._threads), "a request hung past the client's timeout"
        return self.results


def failures(results: list[tuple[int | None, str]]) -> list[tuple[int | None, str]]:
    def ok(status: int | None, body: str) -> bool:
        streamed_ok = body.rstrip().endswith("data: [DONE]") and '"error"' not in body
        return status == 200 and (streamed_ok or (body.startswith("{") and '"choices"' in body))

    return [(status, body[-300:]) for status, body in results if not ok(status, body)]


def reconciled(outage: Outage, replicas: list[Replica], served: int) -> bool:
    """Every request served has its ledger row, and Redis's counter holds exactly their spend with
    nothing left reserved (a reservation whose admission timed out is released too)."""
    key = counter_key("route", "paid-counted", "day", time.time())
    rows = [row for r in replicas for row in ledger_rows(r.ledger, "status = 'ok'")]
    with outage.redis.client() as client:
        spent, reserved = counter(client, outage.prefix, key)
    return (
        len(rows) == served
        and spent == pytest.approx(sum(row["cost_usd"] for row in rows), rel=1e-9)
        and reserved == pytest.approx(0.0, abs=1e-12)
    )


@pytest.fixture
def slow_paid(upstreams: Upstreams) -> Iterator[None]:
    """Answers of a few hundred milliseconds, so requests are mid-way when Redis goes."""
    httpx.post(upstreams.paid.url + "/emulator/faults", json={"slowdown": 40}).raise_for_status()
    yield
    upstreams.reset()


def test_redis_killed_with_requests_in_flight(outage: Outage, slow_paid: None) -> None:
    load = Load(outage.open)
    load.wait_for(12)
    assert outage.redis.proc is not None
    os.kill(outage.redis.proc.pid, signal.SIGKILL)  # no goodbye: connections die mid-command
    outage.redis.proc.wait(10)
    down_at = len(load.results)
    load.wait_for(down_at + 24)  # served on local counts meanwhile
    for replica in outage.open:
        store = replica.ready()["store"]
        assert store["up"] is False and store["fault"], store
        assert metric(replica, "gateway_store_up") == 0
    outage.redis.start()  # the same port, and empty
    eventually(lambda: all(r.ready()["store"]["up"] for r in outage.open))
    load.wait_for(len(load.results) + 12)
    results = load.stop()
    assert not failures(results), failures(results)[:3]
    eventually(lambda: reconciled(outage, outage.open, len(results)), timeout=30)


def test_a_hung_redis_under_load_costs_no_request(outage: Outage, slow_paid: None) -> None:
    """SIGSTOP: Redis accepts connections (the kernel does) but never answers; only the store's socket
    timeouts stand between that and requests waiting for ever."""
    load = Load(outage.open)
    load.wait_for(12)
    assert outage.redis.proc is not None
    os.kill(outage.redis.proc.pid, signal.SIGSTOP)
    try:
        stopped_at = len(load.results)
        load.wait_for(stopped_at + 24)
        for replica in outage.open:
            store = replica.ready()["store"]
            assert store["up"] is False and "did not answer within" in store["fault"], store
            assert metric(replica, "gateway_store_up") == 0
        refused = [ask(outage.closed, stream) for stream in (False, True)]
        for status, body in refused:
            assert status == 503, body
            error = orjson.loads(body)["error"]
            assert error["code"] == "store_unavailable" and error["type"] and error["message"], error
        assert outage.closed.get("/ready").status_code == 503
    finally:
        os.kill(outage.redis.proc.pid, signal.SIGCONT)
    eventually(lambda: all(r.ready()["store"]["up"] for r in [*outage.open, outage.closed]))
    load.wait_for(len(load.results) + 12)
    results = load.stop()
    assert not failures(results), failures(results)[:3]
    eventually(lambda: reconciled(outage, outage.open, len(results)), timeout=30)
    assert ask(outage.closed, False)[0] == 200, "fail-closed serves again once Redis answers"


def test_after_a_restart_no_connection_from_before_it_is_tried(outage: Outage) -> None:
    """Concurrent requests leave the replicas' Redis pools holding several connections; after Redis
    restarts, the ones idle through the outage are dead. Tried one by one, each failed once on first
    use and marked the store down again (two more faults per replica, each a flap of /ready's store
    and of the dashboard's banner). The probe that finds Redis back drops them."""
    with ThreadPoolExecutor(16) as pool:
        assert [r.status_code for r in pool.map(chat, outage.open * 16)] == [200] * 32
        outage.redis.stop()
        assert [chat(replica).status_code for replica in outage.open] == [200, 200]
        outage.redis.start()
        eventually(lambda: all(r.ready()["store"]["up"] for r in outage.open))
        back = [len(r.log.read_text()) for r in outage.open]
        assert [r.status_code for r in pool.map(chat, outage.open * 16)] == [200] * 32
    time.sleep(1.5)  # two background syncs: their connections are the pool's too
    for replica, start in zip(outage.open, back, strict=True):
        after = replica.log.read_text()[start:]
        # A timeout on a loaded machine is a fault of its own, reported as one; a dead connection is not.
        assert "cannot connect to Redis" not in after, after
