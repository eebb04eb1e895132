"""The sizing model and the live signal's hysteresis, worked out by hand (time is passed in)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.measure.capacity import (
    Demand,
    ReplicaShape,
    break_even_arrivals_per_s,
    replicas_worth_running,
    slo_streams,
)
from gateway.measure.demand import DemandSignal
from gateway.policy.load import PolicyError, load_policy

B300 = ReplicaShape(usd_per_hour=62.93, streams=64, stream_tokens_per_s=32.5, ttft_s=1.0, max_replicas=4)
API_USD_PER_TOKEN = 15e-6


def test_a_replica_runs_while_its_share_would_cost_more_on_the_api() -> None:
    # 62.93 $/h over 32.5 tok/s per stream at $15/1M: 35.9 streams pay for a replica's hour.
    per_stream_hour = 32.5 * 3600 * API_USD_PER_TOKEN
    assert 62.93 / per_stream_hour == pytest.approx(35.86, abs=0.01)
    duration = 1.0 + 5000 / 32.5  # Little's law: one stream lasts its TTFT and decode
    for streams, replicas in ((0, 0), (30, 0), (40, 1), (64 + 30, 1), (64 + 40, 2), (1000, 4)):
        demand = Demand(streams / duration, 5000)
        assert replicas_worth_running(demand, B300, API_USD_PER_TOKEN) == replicas, streams
    assert break_even_arrivals_per_s(B300, 5000, API_USD_PER_TOKEN) * duration == pytest.approx(
        35.86, abs=0.01
    )


def test_without_an_api_to_spill_to_every_stream_needs_a_seat() -> None:
    assert replicas_worth_running(Demand(0.01, 5000), B300, None) == 1
    assert replicas_worth_running(Demand(0.0, 5000), B300, None) == 0
    a100 = ReplicaShape(usd_per_hour=20.09, streams=4, stream_tokens_per_s=4.5, max_replicas=4)
    assert math.isinf(break_even_arrivals_per_s(a100, 1000, API_USD_PER_TOKEN)), "never cheaper than the API"


def test_slo_streams_are_the_seats_that_keep_the_minimum_decode_speed() -> None:
    assert slo_streams(92.0, 0.25, 64, 20.0) == 64  # (92/20)^4 = 447 fit; the engine seats 64
    assert slo_streams(92.0, 0.25, 1000, 20.0) == 447
    assert slo_streams(9.0, 0.5, 4, 20.0) == 0  # the A100 pool is too slow for the SLO at all
    assert slo_streams(9.0, 0.5, 4, None) == 4


def _policy(tmp_path: Path, scaling: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"""
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {{gpu_hours: {{usd_per_hour: 1.0}}}}
    scaling: {scaling}
  api:
    dialect: openai
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 0, output_usd_per_mtok: 15}}}}
routes:
  r: {{backends: [pool, api]}}
""")
    return path


def test_the_signal_rises_at_once_and_falls_only_after_the_hold(tmp_path: Path) -> None:
    policy = load_policy(
        _policy(
            tmp_path,
            "{streams_per_replica: 2, stream_tokens_per_s: 40, window_s: 10, scale_down_after_s: 30}",
        )
    )
    now = [0.0]
    signal = DemandSignal(lambda: now[0])

    def arrive(per_second: float, seconds: int) -> None:
        for _ in range(seconds):
            for _ in range(round(per_second)):
                signal.arrived("r")
            now[0] += 1.0

    def desired() -> int:
        return signal.desired_replicas(policy, lambda name: None)["pool"]

    assert desired() == 0, "a pool at zero with no traffic stays at zero"
    for _ in range(60):
        signal.finished("r", 100)  # the output length learned: ~100 tokens, 3.5 s a stream
    arrive(1, 10)  # 1/s: 3.5 streams: two replicas of two streams pay for themselves
    assert desired() == 2
    arrive(0, 11)  # the window is empty: the lower value waits out the hold
    assert desired() == 2
    now[0] += 31
    assert desired() == 0


def test_a_rising_rate_is_forecast_one_boot_time_ahead(tmp_path: Path) -> None:
    path = _policy(tmp_path, "{streams_per_replica: 2, stream_tokens_per_s: 40, window_s: 10, boot_s: 10}")
    policy = load_policy(path)
    now = [0.0]
    signal = DemandSignal(lambda: now[0])
    for _ in range(60):
        signal.finished("r", 100)
    for per_second in [0] * 10 + [1] * 10:  # from nothing to 1/s: the trend doubles it a boot ahead
        for _ in range(per_second):
            signal.arrived("r")
        now[0] += 1.0
    assert signal.desired_replicas(policy, lambda name: None)["pool"] == 4


def test_scaling_belongs_to_a_pool(tmp_path: Path) -> None:
    path = _policy(tmp_path, "{boot_s: 60}").read_text()
    path = path.replace("    pricing: {per_token:", "    scaling: {boot_s: 1}\n    pricing: {per_token:")
    bad = tmp_path / "bad.yaml"
    bad.write_text(path)
    with pytest.raises(PolicyError, match="only a gpu_hours pool has replicas to scale"):
        load_policy(bad)
