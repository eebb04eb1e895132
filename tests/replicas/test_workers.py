"""``gateway serve --workers 2``: whichever worker answers a scrape, /metrics counts every worker's
traffic (prometheus_client's multiprocess mode), and scrape-time gauges are there too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Upstreams, policy_yaml

from .conftest import HELLO, Replica, eventually, start_replicas, stop_replicas

REQUESTS = 40
ROUTES = """
  paid-only:
    backends: [paid-api]
"""


@pytest.fixture
def workers(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Replica]:
    upstreams.reset()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(upstreams, ROUTES) + "ledger: {flush_interval_s: 0.05}\n")
    (replica,) = start_replicas(policy, None, tmp_path, 1, workers="2")
    try:
        yield replica
    finally:
        stop_replicas([replica])


def fresh(url: str) -> httpx.Response:
    """A new connection each time, so the kernel hands it to either worker."""
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30) as client:
        return client.get(url)


async def traffic(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=0)
    body = {"model": "paid-only", "messages": HELLO, "max_tokens": 8}
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(REQUESTS))))


def sample(text: str, name: str, required: bool = True, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total, found = total + float(line.rsplit(" ", 1)[1]), True
    assert found or not required, f"no {name} {labels}"
    return total


def test_two_workers_expose_the_whole_traffic_on_every_scrape(workers: Replica) -> None:
    pids = eventually(
        lambda: len(seen := {fresh(workers.url + "/ready").json()["pid"] for _ in range(20)}) > 1 and seen
    )
    assert len(pids) == 2, "both workers answer on the one port"
    responses = asyncio.run(traffic(workers.url + "/v1/chat/completions"))
    assert [r.status_code for r in responses] == [200] * REQUESTS
    output_tokens = sum(r.json()["usage"]["completion_tokens"] for r in responses)

    for _ in range(12):
        metrics = fresh(workers.url + "/metrics")
        text = metrics.text
        labels = {"route": "paid-only", "backend": "paid-api"}
        assert sample(text, "gateway_requests_total", status="ok", **labels) == REQUESTS
        tokens = sum(
            sample(text, "gateway_tokens_total", False, kind=kind, **labels)
            for kind in ("output", "reasoning")
        )
        assert tokens == output_tokens
        assert sample(text, "gateway_overhead_seconds_count", stream="false") == REQUESTS
        assert sample(text, "gateway_store_up") == 1
    assert "gateway_backend_inflight_requests" in text and "gateway_policy_last_reload_ok" in text
