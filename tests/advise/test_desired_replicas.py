"""``gateway_pool_desired_replicas`` in a real ``gateway serve`` over the emulators: a short load ramp
raises it, and it falls back to zero (a pool at zero is a normal state) once the traffic stops and the
scale-down hold has passed. Bounded: ~60 requests, each a few emulated milliseconds."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PAID_KEY, Upstreams, policy_yaml
from tests.servers import ProcessServer, free_port, python_module, wait_http

# A pool cheap enough that a few requests a second pay for a replica of two streams, so the ramp
# stays small: $1/h against $15 per 1M API tokens at 40 tokens/s per stream is worth a replica from
# ~0.5 streams in flight. Short window, boot and hold so the test takes seconds, not minutes.
SCALING = """
    scaling: {boot_s: 2, max_replicas: 4, streams_per_replica: 2, stream_tokens_per_s: 40,
              window_s: 3, scale_down_after_s: 2}
"""
ROUTES = """
  pool-then-api:
    backends: [b300-vllm, paid-api]
    exploration: 0
"""
GAUGE = re.compile(r'^gateway_pool_desired_replicas\{pool="b300-vllm"\} (\S+)$', re.MULTILINE)


@pytest.fixture
def serving(upstreams: Upstreams, tmp_path: Path) -> Iterator[str]:
    upstreams.reset()
    text = policy_yaml(upstreams, ROUTES).replace(
        "pricing: {gpu_hours: {usd_per_hour: 62.93, accounting: marginal}}",
        "pricing: {gpu_hours: {usd_per_hour: 1.0, accounting: marginal}}" + SCALING,
    )
    assert "scaling:" in text
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    port = free_port()
    args = ["serve", "--policy", str(path), "--port", str(port), "--ledger", str(tmp_path / "ledger.sqlite3")]
    gateway = ProcessServer(python_module("gateway", *args), env={"TEST_PAID_API_KEY": PAID_KEY}).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        assert gateway.stop() == 0
        upstreams.reset()


def desired(url: str) -> float:
    match = GAUGE.search(httpx.get(url + "/metrics", timeout=10).text)
    assert match is not None, "the gauge is missing"
    return float(match.group(1))


def test_the_desired_replicas_rise_with_a_load_ramp_and_fall_after(serving: str) -> None:
    url = serving
    assert desired(url) == 0, "no traffic yet: the pool may stay at zero"
    body = {"model": "pool-then-api", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    seen: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        # The ramp: 1, then 4, then 8 requests a second, about two seconds each (56 requests).
        for per_second in (1, 4, 8):
            for _ in range(2 * per_second):
                assert client.post("/v1/chat/completions", json=body).status_code == 200
                time.sleep(1.0 / per_second)
            seen.append(desired(url))
    assert seen[-1] >= 2, f"the ramp should ask for more than one replica: {seen}"
    assert seen == sorted(seen), f"it rises with the ramp: {seen}"
    capacity = {row["pool"]: row for row in httpx.get(url + "/dashboard/data", timeout=10).json()["capacity"]}
    assert capacity["b300-vllm"]["desired_replicas"] >= 2, "the dashboard shows the recommendation too"
    assert capacity["b300-vllm"]["boot_s"] == 2
    assert capacity["a100-llamacpp"]["desired_replicas"] is None, "a pool without scaling is not sized"
    # No traffic: the rate window empties (3 s), then the lower value holds 2 s before it shows.
    deadline = time.monotonic() + 60
    after = desired(url)
    while after > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        after = desired(url)
    assert after == 0, "back to zero once the traffic is gone"
