"""A trace receiver that hangs, refuses connections or answers errors costs the requests nothing: they
are all answered while the exporter is stuck, and the spans that could not go are counted in
``gateway_trace_spans_dropped_total`` (queue_full while the exporter is stuck, export_failed for the
batch it lost)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway
from tests.servers import free_port
from tests.telemetry.receiver import hanging_receiver, otlp_receiver

REQUESTS = 12


@contextmanager
def gateway_exporting_to(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    telemetry = (
        f"telemetry: {{otlp_endpoint: '{endpoint}', max_queued_traces: 2, batch_traces: 1, "
        "flush_interval_s: 0.05, export_timeout_s: 2}\n"
    )
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + "tuning: {probes: {on_start: false}}\n" + telemetry)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def dropped(gateway: Gateway) -> dict[str, float]:
    counts = {}
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith("gateway_trace_spans_dropped_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


def eventually_dropped(gateway: Gateway, reason: str) -> float:
    deadline = time.monotonic() + 30
    while (count := dropped(gateway).get(reason, 0.0)) == 0:
        assert time.monotonic() < deadline, f"no span counted as dropped ({reason})"
        time.sleep(0.05)
    return count


def send_requests(gateway: Gateway) -> None:
    """Streams and whole answers, each complete and correct."""
    for index in range(REQUESTS):
        body = {
            "model": "vllm-only",
            "messages": [{"role": "user", "content": f"question {index}"}],
            "stream": index % 2 == 0,
            "max_tokens": 20,
        }
        response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.text.rstrip().endswith("[DONE]") if body["stream"] else response.json()["choices"]


def test_a_receiver_that_hangs_delays_no_request_and_drops_are_counted(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        hanging_receiver() as endpoint,
        gateway_exporting_to(upstreams, tmp_path, monkeypatch, endpoint) as gateway,
    ):
        send_requests(gateway)
        # The exporter is stuck on its first batch: the queue of two filled and the rest were dropped.
        assert eventually_dropped(gateway, "queue_full") > 0
        assert eventually_dropped(gateway, "export_failed") > 0  # the hung batch timed out
        assert "gateway_trace_spans_exported_total 0.0" in httpx.get(gateway.url + "/metrics").text


def test_a_receiver_that_refuses_connections_drops_and_counts(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with gateway_exporting_to(upstreams, tmp_path, monkeypatch, nobody) as gateway:
        send_requests(gateway)
        assert eventually_dropped(gateway, "export_failed") > 0


def test_a_receiver_that_answers_errors_drops_and_counts(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as (receiver, server):
        receiver.status = 503
        with gateway_exporting_to(upstreams, tmp_path, monkeypatch, server.url) as gateway:
            send_requests(gateway)
            assert eventually_dropped(gateway, "export_failed") > 0
            receiver.status = 200  # back: the next batches go through
            send_requests(gateway)
            deadline = time.monotonic() + 30
            while "gateway_trace_spans_exported_total 0.0" in httpx.get(gateway.url + "/metrics").text:
                assert time.monotonic() < deadline, "nothing exported once the receiver was back"
                time.sleep(0.05)
