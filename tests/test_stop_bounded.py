"""``gateway serve`` on SIGTERM always ends, whatever is in flight: each test creates for real a
condition under which the stop used to wait for ever, with a request in flight, and the process must
exit on its own within its budget (``--grace-s`` + ``gateway.runtime.stopping.STOP_MARGIN_S``), its log
saying which part of the stop it gave up on.

- A client that never reads its stream: the drain ends the stream, but its error event cannot be
  written, and uvicorn waited for that connection to close ("Waiting for connections to close").
- The ledger's PostgreSQL stops answering mid-stop (a hung server, a network partition: the TCP
  connection stays open and silent): the writer thread blocked in the driver, ``Runtime.close`` in its
  join, uvicorn in "Waiting for application shutdown" (the hang seen in the restart row).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.emulator import create_emulator_app
from gateway.runtime.stopping import STOP_MARGIN_S
from tests.postgres import TcpProxy, scratch_database, url_of
from tests.servers import ProcessServer, ThreadedServer, free_port, python_module, threaded_server, wait_http

GRACE_S = 1.0
# The process must have exited by itself by then: its budget, plus room for a loaded machine to
# schedule it. Before the fix it never exits at all; this only bounds how long the test waits.
EXIT_WITHIN_S = GRACE_S + STOP_MARGIN_S + 30.0


@pytest.fixture
def endless_pool() -> Iterator[ThreadedServer]:
    """A pool whose streams outlast any grace period: ~20k tokens, fast."""
    with threaded_server(create_emulator_app("b300-vllm", time_scale=0.05)) as server:
        faults = {"reasoning_tokens": 0, "content_tokens": 20_000}
        httpx.post(server.url + "/emulator/faults", json=faults, timeout=10).raise_for_status()
        yield server


@contextlib.contextmanager
def gateway(tmp_path: Path, pool: ThreadedServer, ledger: str) -> Iterator[tuple[ProcessServer, str]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"""
backends:
  pool:
    dialect: vllm
    url: {pool.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93}}}}
    timeouts: {{first_byte_s: 30, idle_s: 120}}
routes:
  kimi-k3:
    backends: [pool]
ledger: {{flush_interval_s: 0.1}}
""")
    port = free_port()
    args = python_module(
        "gateway", "serve", "--policy", str(policy), "--port", str(port), "--ledger", ledger,
        "--grace-s", str(GRACE_S),
    )  # fmt: skip
    server = ProcessServer(
        args, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, log_path=str(tmp_path / "gw.log")
    ).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready", timeout=60)
        yield server, url
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()  # the hang this file tests for: never leave it running
            server.proc.wait(30)


def stream_request(port: int) -> socket.socket:
    """A streamed request on a socket whose owner never reads: its receive buffer fills, then the
    gateway's send buffer, and nothing more can be written to it."""
    body = json.dumps({
        "model": "kimi-k3", "stream": True, "max_tokens": 20_000,
        "messages": [{"role": "user", "content": "count to twenty thousand"}],
    }).encode()  # fmt: skip
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
    sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def unsent_bytes(sock: socket.socket) -> int:
    """What the gateway's end of ``sock``'s connection holds in its kernel send queue (/proc/net/tcp)."""
    client_port = sock.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) == client_port:  # the remote end is our client
            return int(fields[4].split(":")[0], 16)
    return 0


def wait_until_stuck(sock: socket.socket) -> None:
    """Until the gateway's send queue for ``sock`` stops moving while its stream still runs: the
    kernel's buffers are full, and what the gateway writes next waits in its own."""
    deadline = time.monotonic() + 60  # bounds a hang only
    last = -1
    while (queued := unsent_bytes(sock)) == 0 or queued != last:
        assert time.monotonic() < deadline, "the gateway's send queue never filled"
        last = queued
        time.sleep(0.5)


def in_flight(url: str) -> float:
    wanted = 'gateway_backend_inflight_requests{backend="pool"} '
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_in_flight(url: str, count: int) -> None:
    deadline = time.monotonic() + 60  # bounds a hang only
    while in_flight(url) < count:
        assert time.monotonic() < deadline, "the requests never reached the upstream"
        time.sleep(0.05)


def exit_code_after_sigterm(server: ProcessServer) -> int | None:
    """SIGTERM by pid; the exit code, or None when the process was still running at the bound."""
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        return None


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "gw.log").read_text(errors="replace")


def test_a_client_that_never_reads_cannot_hold_the_stop(tmp_path: Path, endless_pool: ThreadedServer) -> None:
    with gateway(tmp_path, endless_pool, str(tmp_path / "ledger.sqlite3")) as (server, url):
        port = int(url.rsplit(":", 1)[1])
        sockets = [stream_request(port) for _ in range(2)]
        try:
            wait_in_flight(url, 2)
            for sock in sockets:
                wait_until_stuck(sock)
            code = exit_code_after_sigterm(server)
        finally:
            for sock in sockets:
                sock.close()
        log = log_of(tmp_path)
        assert code is not None, f"still running {EXIT_WITHIN_S:.0f} s after SIGTERM:\n{log[-3000:]}"
        assert code == 0, log[-3000:]
    assert "grace period over: ending 2 requests still in flight" in log
    assert "stop: ledger flush done" in log, "the ledger was closed, after the connections were given up"


class FreezingProxy(TcpProxy):
    """The TCP proxy to PostgreSQL, which can also freeze: connections stay open and nothing passes
    either way (a hung server or a partition, not a refused connection)."""

    def __init__(self) -> None:
        self.flowing = threading.Event()
        self.flowing.set()
        super().__init__()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def ask_whole(url: str, answered: list[int]) -> None:
    payload = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with contextlib.suppress(httpx.HTTPError):
        answered.append(httpx.post(url + "/v1/chat/completions", json=payload, timeout=60).status_code)


def test_a_ledger_database_that_stops_answering_cannot_hold_the_stop(
    tmp_path: Path, endless_pool: ThreadedServer
) -> None:
    with scratch_database() as database:
        proxy = FreezingProxy()
        try:
            with gateway(tmp_path, endless_pool, url_of(database, proxy.port)) as (server, url):
                port = int(url.rsplit(":", 1)[1])
                sock = stream_request(port)  # in flight through the whole stop
                try:
                    wait_in_flight(url, 1)
                    proxy.flowing.clear()  # PostgreSQL hangs: the rows settled from now on cannot be written
                    answered: list[int] = []
                    ask_whole(url, answered)  # answered, its row queued for a database that never replies
                    assert answered == [200]
                    time.sleep(0.5)  # the writer takes the row and blocks in the driver
                    code = exit_code_after_sigterm(server)
                finally:
                    sock.close()
                log = log_of(tmp_path)
                assert code is not None, f"still running {EXIT_WITHIN_S:.0f} s after SIGTERM:\n{log[-3000:]}"
                assert code == 0, "the stop ended by itself, not by its deadline:\n" + log[-3000:]
        finally:
            proxy.flowing.set()
            proxy.close()
    assert "stop: ledger flush still running" in log, log[-3000:]
    assert "rows unwritten" in log
