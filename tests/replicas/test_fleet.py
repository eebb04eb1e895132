"""Three gateway processes, one Redis (our own), the session's emulators: budgets and rate limits hold
fleet-wide, the spend counter is the sum of the three ledgers, and what one replica measures or trips
changes what the others decide."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.money.budgets import counter_key
from gateway.values.auth import digest_of
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

MAX_TOKENS = 50  # below what the emulator writes: every answer is exactly this long
REQUEST_USD = 3 * 0.6e-6 + MAX_TOKENS * 15e-6  # three prompt tokens at $0.60/M, 50 output at $15/M
ALLOWED = 20
LIMIT_USD = (ALLOWED + 0.5) * REQUEST_USD
LIMITED_KEY = "gwk-limited-0123456789abcdefghijklmnopqrstuvwxyzABCDEF"
REQUESTS_PER_MINUTE = 12
ROUTES = f"""
  paid-capped:
    backends: [paid-api]
    budgets: {{per_day_usd: {LIMIT_USD!r}}}
  paid-only:
    backends: [paid-api]
  vllm-only:
    backends: [b300-vllm]
  llamacpp-only:
    backends: [a100-llamacpp]
    fallback: {{max_attempts: 1}}
  fleet-kimi:
    backends: [b300-vllm, paid-api]
    slo: {{ttft_p95_ms: 150}}
    exploration: 0
"""


@dataclass
class Fleet:
    redis: RedisServer
    prefix: str
    replicas: list[Replica]


@pytest.fixture(scope="module")
def fleet(upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    upstreams.reset()
    tmp = tmp_path_factory.mktemp("fleet")
    limited = f"{{name: limited, sha256: {digest_of(LIMITED_KEY)}, routes: [paid-only], "
    limited += f"rate_limit: {{requests_per_minute: {REQUESTS_PER_MINUTE}}}}}"
    prefix = key_prefix()
    policy = tmp / "policy.yaml"
    policy.write_text(
        policy_yaml(upstreams, ROUTES)
        + auth_yaml(limited)
        + "ledger: {flush_interval_s: 0.05}\n"
        # A generous timeout: this test is about shared counts, not faults, on a busy 2-core machine.
        + f"store: {{key_prefix: '{prefix}', timeout_ms: 2000, sync_interval_s: 0.2}}\n"
    )
    with redis_server(tmp) as server:
        replicas = start_replicas(policy, server.url, tmp, 3)
        try:
            yield Fleet(server, prefix, replicas)
        finally:
            stop_replicas(replicas)
            upstreams.reset()


async def spread(
    replicas: list[Replica], route: str, count: int, key: str, **extra: Any
) -> list[httpx.Response]:
    """``count`` requests at once, round-robin over the replicas, each on its own connection."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": route, "messages": HELLO, **extra}
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as client:
        posts = (
            client.post(replicas[i % len(replicas)].url + "/v1/chat/completions", json=body)
            for i in range(count)
        )
        return list(await asyncio.gather(*posts))


def stream(replica: Replica, route: str) -> None:
    body = {"model": route, "messages": HELLO, "stream": True, "max_tokens": 16}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.stream(
        "POST", replica.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        r.read()
    assert r.status_code == 200, r.text


def test_three_replicas_hold_one_budget_under_300_concurrent_requests(fleet: Fleet) -> None:
    responses = asyncio.run(spread(fleet.replicas, "paid-capped", 300, ADMIN_KEY, max_tokens=MAX_TOKENS))
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses[200]

    def all_rows() -> list[Any]:
        rows = [row for r in fleet.replicas for row in ledger_rows(r.ledger, "route = 'paid-capped'")]
        # past 20 a minute, a reason's refusals fold into one row that counts them (ledger/refused.py)
        return rows if sum(row["request_count"] for row in rows) == 300 else []

    rows = eventually(all_rows)
    served = [row for row in rows if row["status"] == "ok"]
    assert len(served) == admitted
    spent = sum(row["cost_usd"] for row in served)
    under_reserved = sum(max(0.0, row["cost_usd"] - row["reserved_usd"]) for row in served)
    assert spent <= LIMIT_USD + under_reserved + 1e-12, (
        "no more than the budget plus what reservations missed"
    )
    assert admitted == ALLOWED, "each reservation equals the cost: exactly the budget's worth got in"
    refused = next(r for r in responses if r.status_code == 429).json()["error"]
    assert refused["code"] == "budget_exhausted"

    key = counter_key("route", "paid-capped", "day", time.time())
    with fleet.redis.client() as client:

        def counter_is_the_ledgers_sum() -> bool:
            spent_now, reserved_now = counter(client, fleet.prefix, key)
            return spent_now == pytest.approx(spent, rel=1e-9) and reserved_now == pytest.approx(0, abs=1e-12)

        eventually(counter_is_the_ledgers_sum)
    for replica in fleet.replicas:
        store = replica.ready()["store"]
        assert store["up"] and store["faults"] == 0, "the counts above were shared, never local"


def test_a_key_rate_limit_holds_across_the_fleet(fleet: Fleet) -> None:
    count = 3 * REQUESTS_PER_MINUTE
    responses = asyncio.run(spread(fleet.replicas, "paid-only", count, LIMITED_KEY, max_tokens=8))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: REQUESTS_PER_MINUTE, 429: count - REQUESTS_PER_MINUTE}
    limited = next(r for r in responses if r.status_code == 429)
    error = limited.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "limited" in error["message"] and LIMITED_KEY not in error["message"]
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert limited.headers["x-ratelimit-limit-requests"] == str(REQUESTS_PER_MINUTE)


def test_a_backend_degraded_in_one_replicas_traffic_changes_another_replicas_decision(
    fleet: Fleet, upstreams: Upstreams
) -> None:
    seer, decider = fleet.replicas[0], fleet.replicas[1]
    for _ in range(3):
        stream(seer, "vllm-only")
        stream(seer, "paid-only")

    def explained(choice: str) -> dict[str, Any]:
        report: dict[str, Any] = decider.get("/admin/explain", model="fleet-kimi").json()
        return (
            report if report["choice"] == choice and all(c["measured"] for c in report["candidates"]) else {}
        )

    before = eventually(lambda: explained("b300-vllm"))
    assert before["reason"] == "cheapest_within_slo", "the idle pool costs nothing more"
    httpx.post(upstreams.vllm.url + "/emulator/faults", json={"added_ttft_ms": 15_000}).raise_for_status()
    try:
        for _ in range(8):
            stream(seer, "vllm-only")
        after = eventually(lambda: explained("paid-api"))
    finally:
        httpx.delete(upstreams.vllm.url + "/emulator/faults")
    slow = next(c for c in after["candidates"] if c["backend"] == "b300-vllm")
    assert slow["meets_ttft"] is False and slow["ttft_p95_s"] > 0.15
    assert ledger_rows(decider.ledger, "backend = 'b300-vllm'") == [], "the decider never called b300 itself"


def test_a_circuit_opened_by_one_replica_is_open_on_the_others(fleet: Fleet, upstreams: Upstreams) -> None:
    tripper, others = fleet.replicas[0], fleet.replicas[1:]

    def circuit(replica: Replica) -> str:
        state: str = replica.get("/admin/backends").json()["backends"]["a100-llamacpp"]["circuit"]
        return state

    # The fault stays on while the others are checked: once it is off, a probe of the open circuit
    # (issue 13) would close it again, and the check would race that recovery.
    httpx.post(upstreams.llamacpp.url + "/emulator/faults", json={"error_rate": 1.0}).raise_for_status()
    try:
        for _ in range(6):
            response = httpx.post(
                tripper.url + "/v1/chat/completions",
                json={"model": "llamacpp-only", "messages": HELLO},
                headers={"authorization": f"Bearer {ADMIN_KEY}"},
                timeout=30,
            )
            assert response.status_code in (502, 503)
        assert circuit(tripper) != "closed"
        for replica in others:
            eventually(lambda replica=replica: circuit(replica) != "closed")
            assert not ledger_rows(replica.ledger, "route = 'llamacpp-only'"), "it never called the backend"
    finally:
        httpx.delete(upstreams.llamacpp.url + "/emulator/faults")


def test_an_upstream_rate_limit_met_by_one_replica_pauses_the_backend_on_the_others(
    fleet: Fleet, upstreams: Upstreams
) -> None:
    limiter, others = fleet.replicas[0], fleet.replicas[1:]

    def paused(replica: Replica) -> bool:
        return replica.get("/admin/backends").json()["backends"]["paid-api"]["paused_until"] is not None

    httpx.post(upstreams.paid.url + "/emulator/faults", json={"rate_limit_rpm": 1}).raise_for_status()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            # The second request meets the 429: its replica pauses the API until Retry-After and waits.
            answers = [
                pool.submit(
                    httpx.post,
                    limiter.url + "/v1/chat/completions",
                    json={"model": "paid-only", "messages": HELLO, "max_tokens": 16},
                    headers={"authorization": f"Bearer {ADMIN_KEY}"},
                    timeout=30,
                )
                for _ in range(2)
            ]
            for replica in others:
                eventually(lambda replica=replica: paused(replica), timeout=10, interval=0.02)
            statuses = sorted(answer.result().status_code for answer in answers)
    finally:
        httpx.delete(upstreams.paid.url + "/emulator/faults")
    assert statuses in ([200, 200], [200, 429]), "a rate limit is never a 502"
