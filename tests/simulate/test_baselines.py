"""The oracle and each baseline on tiny workloads whose right outcome is worked out by hand (see tiny.py:
a one-seat pool, TTFT 1 s, 100 tok/s; an API, TTFT 0.5 s, 50 tok/s; the route's SLO is TTFT 1.5 s)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gateway.simulate.baselines import baseline_names, make_router
from gateway.simulate.report import summarize
from gateway.simulate.workload import Fault
from tests.simulate.tiny import backends, request, run, tiny_policy, ttfts


def test_oracle_fills_the_pool_while_the_slo_holds_and_spills_the_rest(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    # r0 holds the only seat from 0 to 2 s (1 s TTFT, then 100 tokens at 100/s). r1 at 0.5 s would
    # queue until 2 s, a TTFT of 2.5 s > 1.5 s: the API. At 2.5 s the seat is free again.
    result = run(policy, [request(0.0), request(0.5), request(2.5)], make_router("oracle", policy))
    assert backends(result) == ["pool", "api", "pool"]
    assert ttfts(result) == [1.0, 0.5, 1.0]
    summary = summarize(result)
    # The pool is paid for the hour; the API for r1's 101 output tokens at $15 per 1M.
    assert summary["total_cost_usd"] == pytest.approx(36.0 + 101 * 15e-6)
    assert summary["slo_attainment"] == 1.0


def test_oracle_queues_on_the_pool_when_the_api_is_down(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    down = (Fault(backend="api", kind="down", start_s=0.0, end_s=10.0),)
    result = run(policy, [request(0.0), request(0.5)], make_router("oracle", policy), faults=down)
    assert backends(result) == ["pool", "pool"]
    assert ttfts(result) == [1.0, 2.5]  # waits for the seat until 2 s, then its own 1 s TTFT
    assert summarize(result)["slo_attainment"] == 0.5


def test_round_robin_alternates(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    result = run(policy, [request(t) for t in (0.0, 10.0, 20.0, 30.0)], make_router("round-robin", policy))
    assert backends(result) == ["pool", "api", "pool", "api"]


def test_shuffle_is_a_fair_seeded_coin(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    requests = [request(10.0 * i) for i in range(200)]
    first = run(policy, requests, make_router("shuffle", policy))
    again = run(policy, requests, make_router("shuffle", policy))
    assert backends(first) == backends(again), "seeded: the same picks every run"
    share = Counter(backends(first))["pool"] / 200
    assert 0.4 < share < 0.6


def test_least_busy_takes_the_backend_with_fewest_in_flight(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    # r0 at 0 -> pool (tie, route order). r1 at 0.5: pool has 1 in flight, api 0 -> api.
    # r2 at 0.6: both have 1 -> pool (route order), queueing behind r0. r3 at 5: all done -> pool.
    result = run(
        policy, [request(0.0), request(0.5), request(0.6), request(5.0)], make_router("least-busy", policy)
    )
    assert backends(result) == ["pool", "api", "pool", "pool"]
    assert ttfts(result)[2] == pytest.approx(2.4)  # seat free at 2.0, then 1 s: 3.0 - 0.6


def test_lowest_latency_tries_the_unmeasured_then_keeps_the_fastest(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    # r0 -> pool (both unmeasured; route order); r1 -> api (still unmeasured); then api's mean TTFT
    # 0.5 s beats the pool's 1 s, so r2 and r3 go to the api.
    result = run(policy, [request(t) for t in (0.0, 5.0, 10.0, 15.0)], make_router("lowest-latency", policy))
    assert backends(result) == ["pool", "api", "api", "api"]


def test_lowest_price_goes_by_list_price(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    # The pool's list price is $36/h at its assumed 100 tok/s: $100 per 1M, dearer than the API's $15.
    result = run(policy, [request(t) for t in (0.0, 5.0, 10.0)], make_router("lowest-price", policy))
    assert backends(result) == ["api", "api", "api"]


def test_all_to_one_backend_queues_everything_there(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    result = run(policy, [request(0.0), request(0.5), request(1.0)], make_router("all-to-pool", policy))
    assert backends(result) == ["pool", "pool", "pool"]
    # One seat: r1 starts at 2 s (TTFT 3 - 0.5), r2 at 4 s (TTFT 5 - 1).
    assert ttfts(result) == [1.0, 2.5, 4.0]
    assert summarize(result)["slo_attainment"] == pytest.approx(1 / 3)


def test_every_named_baseline_runs(tmp_path: Path) -> None:
    policy = tiny_policy(tmp_path)
    assert baseline_names(policy) == [
        "round-robin", "shuffle", "least-busy", "lowest-latency", "lowest-price", "oracle",
        "all-to-pool", "all-to-api",
    ]  # fmt: skip
    for name in baseline_names(policy):
        result = run(policy, [request(0.0), request(1.0)], make_router(name, policy))
        assert all(o.ok for o in result.outcomes), name
    with pytest.raises(ValueError, match="unknown baseline"):
        make_router("fastest-ever", policy)
