"""``gateway serve`` on SIGTERM, as a real process with streams in flight against a slow emulator:
/ready fails at once, open streams finish within ``--grace-s``, those still open after it end with an
SSE error event (not a cut connection), and every request has its ledger row when the process exits."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.emulator import create_emulator_app
from gateway.runtime.drain import SHUTDOWN_CODE
from tests.servers import ProcessServer, ThreadedServer, free_port, python_module, threaded_server, wait_http

STREAMS = 3


@pytest.fixture
def slow_pool() -> Iterator[ThreadedServer]:
    with threaded_server(create_emulator_app("b300-vllm", time_scale=1.0)) as server:
        yield server


@dataclass
class Stream:
    first_chunk: threading.Event = field(default_factory=threading.Event)
    body: str = ""
    status: int | None = None
    error: str | None = None  # the client's exception, if the connection was cut


def read_stream(url: str, stream: Stream) -> None:
    payload = {
        "model": "kimi-k3",
        "stream": True,
        "messages": [{"role": "user", "content": "count slowly"}],
        "max_tokens": 400,
    }
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=payload, timeout=120) as response:
            stream.status = response.status_code
            for text in response.iter_text():
                stream.body += text
                stream.first_chunk.set()
    except httpx.HTTPError as exc:
        stream.error = repr(exc)
    finally:
        stream.first_chunk.set()


@contextlib.contextmanager
def gateway_process(
    tmp_path: Path, upstream: ThreadedServer, grace_s: float, *extra: str
) -> Iterator[tuple[ProcessServer, str]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"""
backends:
  pool:
    dialect: vllm
    url: {upstream.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    signals: {{health_url: {upstream.url}/health}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
  kimi-k3:
    backends: [pool]
""")
    port = free_port()
    args = python_module(
        "gateway", "serve", "--policy", str(policy), "--port", str(port),
        "--ledger", str(tmp_path / "ledger.sqlite3"), "--grace-s", str(grace_s), *extra,
    )  # fmt: skip
    server = ProcessServer(
        args, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, log_path=str(tmp_path / "gw.log")
    )
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready", timeout=60)
        yield server, url
    finally:
        server.stop(timeout=60)


def streams_in_flight(url: str, count: int = STREAMS) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream() for _ in range(count)]
    threads = [threading.Thread(target=read_stream, args=(url, s)) for s in streams]
    for thread in threads:
        thread.start()
    for stream in streams:
        assert stream.first_chunk.wait(60) and stream.error is None, stream.error
    return streams, threads


def assert_ended_by_the_stop(stream: Stream) -> None:
    """A stream the grace period ran out on: tokens flowed, then the stop's SSE error event, then a close."""
    assert stream.error is None, f"the connection was cut instead of closed: {stream.error}"
    assert stream.status == 200
    last = stream.body.rstrip().rsplit("\n\n", 1)[-1]
    assert last.startswith("data: {") and SHUTDOWN_CODE in last, stream.body[-400:]
    assert '"content"' in stream.body, "tokens flowed before the stop"


def sigterm_then_ready_status(server: ProcessServer, url: str) -> int:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)  # by pid, as Kubernetes would
    return httpx.get(url + "/ready", timeout=10).status_code


def ledger_rows(tmp_path: Path) -> list[tuple[str, str | None]]:
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.sqlite3")) as db:
        return list(db.execute("SELECT status, error_type FROM requests"))


def test_streams_in_flight_finish_within_the_grace_period(tmp_path: Path, slow_pool: ThreadedServer) -> None:
    # About 30 tokens at ~9 tokens/s: each stream outlives the SIGTERM by seconds, well within 60 s.
    httpx.post(
        slow_pool.url + "/emulator/faults", json={"reasoning_tokens": 0, "content_tokens": 30, "slowdown": 10}
    )
    with gateway_process(tmp_path, slow_pool, grace_s=60) as (server, url):
        streams, threads = streams_in_flight(url)
        assert sigterm_then_ready_status(server, url) == 503, "a load balancer must stop sending at once"
        for thread in threads:
            thread.join(90)
        assert server.proc is not None and server.proc.wait(60) == 0
    for stream in streams:
        assert stream.error is None and stream.status == 200, stream.error
        assert stream.body.rstrip().endswith("data: [DONE]"), stream.body[-300:]
        assert SHUTDOWN_CODE not in stream.body
    assert ledger_rows(tmp_path) == [("ok", None)] * STREAMS, "the ledger was flushed before the exit"


def test_streams_open_after_the_grace_period_end_with_an_error_event(
    tmp_path: Path, slow_pool: ThreadedServer
) -> None:
    # About 300 tokens at ~3 tokens/s: far longer than the one-second grace period.
    httpx.post(
        slow_pool.url + "/emulator/faults",
        json={"reasoning_tokens": 0, "content_tokens": 300, "slowdown": 30},
    )
    with gateway_process(tmp_path, slow_pool, grace_s=1) as (server, url):
        streams, threads = streams_in_flight(url)
        assert sigterm_then_ready_status(server, url) == 503
        for thread in threads:
            thread.join(90)
        assert server.proc is not None and server.proc.wait(60) == 0
    for stream in streams:
        assert_ended_by_the_stop(stream)
    assert ledger_rows(tmp_path) == [("error", SHUTDOWN_CODE)] * STREAMS, "the row says why it ended"


def inflight_at_gateway(url: str) -> float:
    wanted = 'gateway_backend_inflight_requests{backend="pool"} '
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def ask_whole(url: str, outcome: dict[str, object]) -> None:
    payload = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    try:
        response = httpx.post(url + "/v1/chat/completions", json=payload, timeout=120)
        outcome["status"], outcome["body"] = response.status_code, response.text
    except httpx.HTTPError as exc:
        outcome["error"] = repr(exc)


def test_requests_still_waiting_for_their_first_byte_are_bounded_by_the_grace_period(
    tmp_path: Path, slow_pool: ThreadedServer
) -> None:
    """The drain counts a request from its arrival, not from its first byte: a stream still waiting for
    its first token at SIGTERM, and a whole answer still being computed, get a 503 when the grace runs
    out (nothing was sent, so a client may retry elsewhere) instead of holding the process for as long
    as the upstream takes, past any grace period (which a rolling restart met as a replica that did not
    stop)."""
    # The first token comes after a minute: far past the one-second grace period.
    httpx.post(slow_pool.url + "/emulator/faults", json={"added_ttft_ms": 60_000}).raise_for_status()
    with gateway_process(tmp_path, slow_pool, grace_s=1) as (server, url):
        streams = [Stream() for _ in range(2)]
        whole: dict[str, object] = {}
        threads = [threading.Thread(target=read_stream, args=(url, s)) for s in streams]
        threads.append(threading.Thread(target=ask_whole, args=(url, whole)))
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60  # bounds a hang only
        while inflight_at_gateway(url) < len(threads):
            assert time.monotonic() < deadline, "the requests never reached the upstream"
            time.sleep(0.05)
        assert sigterm_then_ready_status(server, url) == 503
        for thread in threads:
            thread.join(90)
        assert server.proc is not None and server.proc.wait(60) == 0
    for stream in streams:
        assert stream.error is None, f"the connection was cut instead of answered: {stream.error}"
        assert stream.status == 503 and SHUTDOWN_CODE in stream.body, (stream.status, stream.body[-400:])
    assert "error" not in whole and whole["status"] == 503, whole
    assert SHUTDOWN_CODE in str(whole["body"]), whole
    assert ledger_rows(tmp_path) == [("error", SHUTDOWN_CODE)] * len(threads), "every request has its row"
