"""Three gateway processes, one Redis and one PostgreSQL ledger (a database of this run's own, reached
through a loopback proxy the test can cut): `gateway spend --ledger URL` sees the whole fleet and
agrees with the responses and the Prometheus counters; a SIGTERM under load loses no row; twenty
seconds without the database fail no request, and the backlog is written when it returns."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Upstreams, policy_yaml
from tests.postgres import TcpProxy, scratch_database, url_of
from tests.servers import python_module

from .conftest import (
    ADMIN_KEY,
    HELLO,
    Replica,
    auth_yaml,
    eventually,
    key_prefix,
    redis_server,
    start_replicas,
    stop_replicas,
)

ROUTES = """
  paid-only:
    backends: [paid-api]
  pooled:
    # The GPU pool first, the paid API when it is slow or full: a busy machine fails no request.
    backends: [b300-vllm, paid-api]
    exploration: 0
"""
OUTAGE_S = 20.0


@dataclass
class SharedFleet:
    url: str  # the ledger, through the proxy
    direct_url: str  # the same database, straight to the server (for the test's own reads)
    proxy: TcpProxy
    replicas: list[Replica]
    policy: Any
    redis_url: str


@pytest.fixture(scope="module")
def shared(upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedFleet]:
    upstreams.reset()
    tmp = tmp_path_factory.mktemp("shared-ledger")
    policy = tmp / "policy.yaml"
    policy.write_text(
        roomy(policy_yaml(upstreams, ROUTES))
        + auth_yaml()
        + f"ledger: {{flush_interval_s: 0.05, close_timeout_s: 5, spool_dir: '{tmp / 'spool'}'}}\n"
        + f"store: {{key_prefix: '{key_prefix()}', timeout_ms: 2000, sync_interval_s: 0.2}}\n"
    )
    proxy = TcpProxy()
    with scratch_database() as name, redis_server(tmp) as redis:
        url = url_of(name, proxy.port)
        replicas = start_replicas(policy, redis.url, tmp, 3, ledger_url=url)
        try:
            yield SharedFleet(url, url_of(name), proxy, replicas, policy, redis.url)
        finally:
            stop_replicas(replicas)
            proxy.close()
            upstreams.reset()


def roomy(policy: str) -> str:
    """The test policy with room for 300 requests at once on a busy two-core machine: this test is
    about the ledger, not about limits, so the GPU pool and the paid API take them all, unhurried."""
    for backend in ("b300-vllm", "paid-api"):
        head, tail = policy.split(f"\n  {backend}:\n", 1)
        tail = tail.replace(
            "    timeouts: {first_byte_s: 5, idle_s: 2}\n",
            "    timeouts: {first_byte_s: 30, idle_s: 15}\n    max_concurrency: 1000\n",
            1,
        )
        policy = f"{head}\n  {backend}:\n{tail}"
    return policy


def rows(url: str, where: str = "true") -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return list(conn.execute(f"SELECT * FROM requests WHERE {where}".encode()))


def metrics(replica: Replica) -> dict[str, float]:
    """Each sample's value by name and labels, e.g. ``gateway_spend_usd_total{route=..,backend=..}``."""
    out = {}
    for family in text_string_to_metric_families(replica.get("/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def fleet_spend_counter(replicas: list[Replica]) -> float:
    return sum(
        value
        for replica in replicas
        for name, value in metrics(replica).items()
        if name.startswith("gateway_spend_usd_total{")
    )


def spend_report(url: str, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        python_module("gateway", "spend", "--ledger", url, "--format", "json", "--since", "1h", *args),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


async def spread(replicas: list[Replica], count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as client:
        posts = (
            client.post(
                replicas[i % len(replicas)].url + "/v1/chat/completions",
                json={"model": ("paid-only", "pooled")[i % 2], "messages": HELLO, "max_tokens": 40},
            )
            for i in range(count)
        )
        return list(await asyncio.gather(*posts))


def test_fleet_spend_equals_the_responses_costs_and_the_counters(shared: SharedFleet) -> None:
    before = fleet_spend_counter(shared.replicas)
    started = {row["request_id"] for row in rows(shared.direct_url)}
    responses = asyncio.run(spread(shared.replicas, 300))
    refused = [r.text for r in responses if r.status_code != 200]
    assert not refused, f"{len(refused)} of 300 failed, e.g. {refused[0]}"
    ids = {r.headers["x-request-id"] for r in responses}
    header_usd = sum(float(r.headers["x-gateway-cost-usd"]) for r in responses)

    def all_written() -> list[dict[str, Any]]:
        mine = [row for row in rows(shared.direct_url) if row["request_id"] in ids]
        return mine if len(mine) == 300 else []

    written = eventually(all_written, timeout=30)
    assert {row["replica"] for row in written} == {
        f"{replica_host()}:{replica.process.proc.pid}"  # type: ignore[union-attr]
        for replica in shared.replicas
    }, "every replica wrote its share, signed with its name"
    ledger_usd = sum(row["cost_usd"] for row in written)
    # Headers carry 8 decimals: each may be off by half a unit of the last one.
    assert ledger_usd == pytest.approx(header_usd, abs=300 * 5e-9)
    assert fleet_spend_counter(shared.replicas) - before == pytest.approx(ledger_usd, rel=1e-9)

    report = spend_report(shared.url)
    assert report["ledger"] == shared.url, "the report names the ledger it read"
    earlier = sum(row["cost_usd"] for row in rows(shared.direct_url) if row["request_id"] in started)
    assert report["total_usd"] == pytest.approx(ledger_usd + earlier, rel=1e-9)
    by_replica = spend_report(shared.url, "--by", "replica")
    assert len(by_replica["rows"]) >= 3
    assert sum(r["requests"] for r in by_replica["rows"]) == 300 + len(started)


def replica_host() -> str:
    import socket

    return socket.gethostname()


@dataclass
class Load:
    """Workers sending requests with known ids (a replica each, in turn) until told to stop."""

    replicas: list[Replica]
    workers: int
    completed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.workers)))

    async def _worker(self, client: httpx.AsyncClient, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            request_id = f"load-{os.getpid()}-{worker}-{n}"
            replica = self.replicas[(worker + n) % len(self.replicas)]
            body = {"model": "paid-only", "messages": HELLO, "stream": n % 2 == 0, "max_tokens": 20}
            headers = {"authorization": f"Bearer {ADMIN_KEY}", "x-request-id": request_id}
            try:
                async with client.stream(
                    "POST", replica.url + "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    text = (await response.aread()).decode()
            except httpx.HTTPError:
                self.failed.append(request_id)
                if len(self.replicas) == 1:
                    return  # its only gateway stopped listening
                continue
            if response.status_code == 200 and (not body["stream"] or "data: [DONE]" in text):
                self.completed.append(request_id)
            else:
                self.failed.append(request_id)
            await asyncio.sleep(0.02)


def test_postgres_away_for_twenty_seconds_fails_no_request_and_the_backlog_is_written(
    shared: SharedFleet,
) -> None:
    load = Load(shared.replicas, workers=6)
    thread = threading.Thread(target=load.run)
    thread.start()
    try:
        eventually(lambda: len(load.completed) >= 30, timeout=30)
        shared.proxy.cut()
        cut_at = time.monotonic()
        answered_at_cut = len(load.completed)

        def backlog() -> list[dict[str, float]]:
            seen = [metrics(r) for r in shared.replicas]
            waiting = all(held(m) > 0 and m["gateway_ledger_up{}"] == 0 for m in seen)
            return seen if waiting else []

        during = eventually(backlog, timeout=OUTAGE_S / 2)
        assert all(m["gateway_ledger_oldest_pending_age_seconds{}"] > 0 for m in during)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
        served_in_outage = len(load.completed) - answered_at_cut
        pending_before = sum(held(metrics(r)) for r in shared.replicas)
        shared.proxy.restore()
        time.sleep(2.0)
    finally:
        load.stop.set()
        thread.join(timeout=60)
    assert not load.failed, f"{len(load.failed)} requests failed during the outage"
    assert served_in_outage >= 50, "traffic went on while the ledger was away"
    assert pending_before >= served_in_outage * 0.9

    def written() -> bool:
        ids = {row["request_id"] for row in rows(shared.direct_url, "request_id LIKE 'load-%'")}
        return set(load.completed) <= ids

    eventually(written, timeout=30)
    load_rows = rows(shared.direct_url, "request_id LIKE 'load-%'")
    assert len(load_rows) == len({r["request_id"] for r in load_rows}), "no row written twice"
    for replica in shared.replicas:
        # Each replica is back once its pool has a connection again (psycopg's pool reconnects with a
        # backoff of its own), even one whose rows another replica wrote from the shared spool.
        eventually(lambda r=replica: metrics(r)["gateway_ledger_up{}"] == 1 and held(metrics(r)) == 0)
        assert metrics(replica)["gateway_ledger_write_errors_total{}"] > 0


def held(seen: dict[str, float]) -> float:
    """Rows a replica holds for the ledger: in memory, and in its spool while the database is away."""
    return seen["gateway_ledger_pending_rows{}"] + seen["gateway_ledger_spool_rows{}"]


def test_a_replica_sigtermed_under_load_loses_no_row(
    shared: SharedFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("sigterm")
    (victim,) = start_replicas(shared.policy, shared.redis_url, tmp, 1, ledger_url=shared.url)
    load = Load([victim], workers=24)
    thread = threading.Thread(target=load.run)
    thread.start()
    try:
        eventually(lambda: len(load.completed) >= 60, timeout=60)
        answered_before = len(load.completed)
        assert victim.process.proc is not None
        os.kill(victim.process.proc.pid, signal.SIGTERM)
        assert victim.process.proc.wait(timeout=60) == 0
    finally:
        load.stop.set()
        thread.join(timeout=60)
        victim.process.stop()
    assert len(load.completed) >= answered_before
    ids = {row["request_id"] for row in rows(shared.direct_url, "request_id LIKE 'load-%'")}
    missing = set(load.completed) - ids
    assert not missing, f"{len(missing)} answered requests have no ledger row: {sorted(missing)[:5]}"
    assert "unwritten" not in victim.log.read_text()
