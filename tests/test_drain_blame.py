"""Streams a graceful stop ends are the gateway's doing, not the backend's: the backend's circuit, its
failure counts and the upstream-error metric stay clean (a rolling restart must not open circuits on
healthy backends, nor tell the fleet to), and each stream's ledger row says ``gateway_shutting_down``."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.runtime.drain import SHUTDOWN_CODE
from tests.conftest import Gateway, Upstreams, running_gateway
from tests.test_graceful_stop import Stream, read_stream

STREAMS = 3


@pytest.fixture
def stopping(upstreams: Upstreams, tmp_path: Path) -> Iterator[Gateway]:
    upstreams.reset()
    # Long streams: ~300 tokens slowed fifty times, far longer than the test.
    httpx.post(
        upstreams.vllm.url + "/emulator/faults",
        json={"reasoning_tokens": 0, "content_tokens": 300, "slowdown": 200},
    ).raise_for_status()
    path = tmp_path / "policy.yaml"
    path.write_text(f"""
backends:
  pool:
    dialect: vllm
    url: {upstreams.vllm.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
  kimi-k3:
    backends: [pool]
ledger: {{flush_interval_s: 0.05}}
tuning:
  probes: {{enabled: false}}
  circuit: {{failure_threshold: 1, base_cooldown_s: 600, max_cooldown_s: 600}}  # one failure opens it
""")
    try:
        with running_gateway(path) as gateway:
            yield gateway
    finally:
        upstreams.reset()


def test_streams_ended_by_a_stop_are_not_the_backends_failures(stopping: Gateway) -> None:
    streams = [Stream() for _ in range(STREAMS)]
    threads = [threading.Thread(target=read_stream, args=(stopping.url, s), daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    for stream in streams:
        assert stream.first_chunk.wait(60) and stream.error is None, stream.error
    runtime = stopping.runtime
    loop: asyncio.AbstractEventLoop = stopping.server.server.servers[0].get_loop()
    # What SIGTERM starts in ``gateway serve``, with no grace: every open stream is ended now.
    asyncio.run_coroutine_threadsafe(runtime.drain.run(0.0), loop).result(30)
    for thread in threads:
        thread.join(30)
    for stream in streams:
        last = stream.body.rstrip().rsplit("\n\n", 1)[-1]
        assert stream.error is None and SHUTDOWN_CODE in last, stream.body[-300:]

    deadline = time.monotonic() + 15
    while runtime.ledger.rows_written < STREAMS and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.closing(sqlite3.connect(stopping.policy_path.parent / "ledger.sqlite3")) as db:
        rows = list(db.execute("SELECT status, error_type, attempt_log FROM requests"))
    assert [(status, error) for status, error, _ in rows] == [("error", SHUTDOWN_CODE)] * STREAMS, rows
    assert all('"status":"cancelled"' in log for _, _, log in rows), rows
    assert runtime.stats.view("pool").circuit == "closed", "the backend did nothing wrong"
    metrics = httpx.get(stopping.url + "/metrics", timeout=10).text
    assert not [line for line in metrics.splitlines() if line.startswith("gateway_upstream_errors_total{")]
    assert f'status="{SHUTDOWN_CODE}"' in metrics, "the requests metric says why they ended"
