"""``gateway serve --workers 2`` on SIGTERM drains each worker as the single process drains: uvicorn's
supervisor passes SIGTERM to every worker, /ready fails at once whichever worker answers, streams get
the grace period, then end with the SSE error event, and each worker's ledger rows say why."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from pathlib import Path

import httpx

from gateway.runtime.drain import SHUTDOWN_CODE
from tests.replicas.conftest import eventually
from tests.servers import ThreadedServer
from tests.test_graceful_stop import assert_ended_by_the_stop, gateway_process, slow_pool, streams_in_flight

__all__ = ["slow_pool"]  # the fixture, shared with the single-process tests
STREAMS = 6  # spread over the two workers by the kernel's accept


def log_of(tmp_path: Path) -> str:
    return (tmp_path / "gw.log").read_text(errors="replace")


def fresh_ready(url: str) -> int:
    """/ready on a new connection each time, so either worker may answer."""
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=10) as client:
        return client.get(url + "/ready").status_code


def test_each_worker_drains_then_ends_its_streams_with_an_error_event(
    tmp_path: Path, slow_pool: ThreadedServer
) -> None:
    # About 300 tokens at ~3 tokens/s: far longer than the two-second grace period.
    httpx.post(
        slow_pool.url + "/emulator/faults",
        json={"reasoning_tokens": 0, "content_tokens": 300, "slowdown": 30},
    )
    with gateway_process(tmp_path, slow_pool, 2, "--workers", "2") as (server, url):
        streams, threads = streams_in_flight(url, STREAMS)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)  # to the supervisor, by pid, as Kubernetes would
        # The supervisor passes it on at once (uvicorn's own loop would take up to half a second): wait
        # for it to say so, so the next check does not race its scheduling on a busy machine.
        eventually(lambda: log_of(tmp_path).count("Terminated child process") == 2, timeout=30)
        assert [fresh_ready(url) for _ in range(6)] == [503] * 6, "every worker fails /ready at once"
        for thread in threads:
            thread.join(90)
        assert server.proc is not None and server.proc.wait(60) == 0
    for stream in streams:
        assert_ended_by_the_stop(stream)
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.sqlite3")) as db:
        rows = list(db.execute("SELECT status, error_type, replica FROM requests"))
    assert [(status, error) for status, error, _ in rows] == [("error", SHUTDOWN_CODE)] * STREAMS, rows
    log = log_of(tmp_path)
    assert "Traceback" not in log, log[-2000:]
