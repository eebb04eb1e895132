"""``dialect: sglang``: the emulator's SGLang wire shapes and metric names, the gateway's parser of them,
and a route that moves off an SGLang server whose scraped queue is deep."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.emulator import create_emulator_app
from gateway.measure.signals import parse_sglang_metrics
from tests.conftest import emulated_clock, running_gateway
from tests.servers import ThreadedServer, threaded_server
from tests.test_exchange import eventually

TIME_SCALE = 0.05
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def sglang_pair() -> Iterator[tuple[ThreadedServer, ThreadedServer]]:
    with (
        threaded_server(create_emulator_app("h200-sglang", time_scale=TIME_SCALE)) as cheap,
        threaded_server(create_emulator_app("h200-sglang", time_scale=TIME_SCALE, seed=1)) as dear,
    ):
        yield cheap, dear


def test_the_emulator_speaks_sglang_and_the_gateway_reads_its_metrics(
    sglang_pair: tuple[ThreadedServer, ThreadedServer],
) -> None:
    server = sglang_pair[0]
    body = {"model": "m", "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as response:
        text = response.read().decode()
    assert '"reasoning_content":"think0 "' in text and '"matched_stop":null' in text
    page = httpx.get(server.url + "/metrics").text
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "gen_throughput"):
        assert f"sglang:{name}{{" in page
    assert "sglang:time_to_first_token_seconds_bucket{" in page
    signals = parse_sglang_metrics(page, 10.0, None)
    assert (signals.running, signals.waiting) == (0.0, 0.0)
    assert signals.ttft_mean_s is not None and signals.ttft_mean_s > 0  # one request measured


def test_parse_sglang_metrics_sums_dp_ranks_counts_tp_ranks_once_and_reads_throughput() -> None:
    """Data-parallel ranks run their own batches (summed); the TP ranks of one group run the same batch
    and all report it with --enable-metrics-for-all-schedulers (counted once)."""
    page = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="2",dp_rank="1"} 2.0
sglang:num_running_reqs{model_name="m",tp_rank="3",dp_rank="1"} 2.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 7.0
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 7.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.25
sglang:gen_throughput{model_name="m",tp_rank="0"} 812.5
sglang:time_to_first_token_seconds_sum{model_name="m"} 6.0
sglang:time_to_first_token_seconds_count{model_name="m"} 4.0
"""
    signals = parse_sglang_metrics(page, 1.0, None)
    assert (signals.running, signals.waiting, signals.kv_cache_usage) == (5.0, 7.0, 0.25)
    assert (signals.generation_tokens_per_s, signals.ttft_mean_s) == (812.5, 1.5)


def policy(cheap: ThreadedServer, dear: ThreadedServer) -> str:
    def backend(name: str, server: ThreadedServer, usd_per_hour: float) -> str:
        return f"""
  {name}:
    dialect: sglang
    url: {server.url}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory
    max_concurrency: 2
    pricing: {{gpu_hours: {{usd_per_hour: {usd_per_hour}, accounting: marginal}}}}
    signals: {{metrics_url: {server.url}/metrics, health_url: {server.url}/health, interval_s: 0.05}}
"""

    return f"""
backends:{backend("cheap-sglang", cheap, 20.0)}{backend("dear-sglang", dear, 60.0)}
routes:
  kimi-k3:
    backends: [cheap-sglang, dear-sglang]
    slo: {{ttft_p95_ms: 4000}}
    exploration: 0
# No probes: a one-token probe would give the dear server a short TTFT sample, and with both pools'
# headroom free (marginal), that TTFT would break the tie this test sets up on the queue alone.
tuning: {{probes: {{enabled: false}}}}
"""


def ask(url: str, model: str = "kimi-k3") -> httpx.Response:
    body: dict[str, Any] = {"model": model, "messages": HELLO, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        response.read()
    assert response.status_code == 200, response.text
    return response


def test_a_route_moves_off_an_sglang_server_whose_queue_is_deep(
    sglang_pair: tuple[ThreadedServer, ThreadedServer], tmp_path: Path
) -> None:
    cheap, dear = sglang_pair
    path = tmp_path / "policy.yaml"
    path.write_text(policy(cheap, dear))
    options = {"clock": emulated_clock(TIME_SCALE), "rng": random.Random(7)}
    with running_gateway(path, **options) as gateway:
        served = [ask(gateway.url).headers["x-gateway-backend"] for _ in range(4)]
        assert served == ["cheap-sglang"] * 4  # the cheaper one while it meets the SLO
        # Others' traffic queues up on the cheap server (one seat, each request held a minute).
        httpx.post(
            cheap.url + "/emulator/faults", json={"seats": 1, "added_ttft_ms": 60_000}
        ).raise_for_status()
        body = {"model": "m", "messages": HELLO, "stream": True}
        clients = [httpx.Client(timeout=60) for _ in range(6)]
        streams = [c.stream("POST", cheap.url + "/v1/chat/completions", json=body) for c in clients]
        try:
            for stream in streams:
                stream.__enter__()
        except httpx.ReadTimeout:
            pass
        try:
            runtime = gateway.runtime

            def queued() -> bool:
                signals = runtime.stats.view("cheap-sglang").signals
                return signals is not None and (signals.waiting or 0) >= 5

            eventually(queued, 10, "the scraped queue depth of the cheap server")
            response = ask(gateway.url)
            assert response.headers["x-gateway-backend"] == "dear-sglang", response.headers[
                "x-gateway-decision"
            ]
            report = httpx.get(gateway.url + "/admin/explain", params={"model": "kimi-k3"}).json()
            cheap_eval = next(c for c in report["candidates"] if c["backend"] == "cheap-sglang")
            # The queue it scraped puts the cheap server's predicted TTFT past the SLO.
            assert cheap_eval["queue_wait_s"] > 0 and cheap_eval["feasible"] is False, cheap_eval
        finally:
            for client in clients:
                client.close()
            httpx.delete(cheap.url + "/emulator/faults")
