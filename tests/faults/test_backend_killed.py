"""A backend process SIGKILLed while many streams flow from it through the gateway: every stream on a
route that can resume reads one whole answer (word0..wordN, each once) continued on the other pool;
every stream on a route that cannot ends with a clean SSE error event after the words it had; requests
that were waiting for their first token fall back to the other pool before any byte, and requests sent
after the kill go there; the ledger has exactly one row per request, its attempt_log naming the second
attempt of each request that needed one."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import PAID_KEY, Gateway, Upstreams, running_gateway
from tests.replicas.conftest import eventually
from tests.servers import ProcessServer, ThreadedServer, free_port, python_module, wait_http
from tests.spend.conftest import ledger_rows
from tests.test_resume import HELLO, numbered, policy, second_pool, set_faults, sse_events, stream_text

__all__ = ["second_pool"]  # the fixture: pool-b, the pool streams continue on
RESUMABLE, CANNOT = 6, 3  # streams in flight on "two-pools" and on "cannot-resume" when pool-a dies
WAITING = 3  # streams on "two-pools" sent to pool-a that have no first token yet when it dies
WORDS = 600  # ~6 s at the emulator's real speed: every stream is mid-answer when the kill comes
WORDS_BEFORE_KILL = 10


@dataclass
class Reader:
    route: str
    body: str = ""
    status: int | None = None
    backend: str | None = None
    error: str | None = None
    words: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def run(self, base_url: str) -> None:
        payload = {
            "model": self.route,
            "messages": HELLO,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with httpx.stream("POST", base_url + "/chat/completions", json=payload, timeout=120) as response:
                self.status, self.backend = response.status_code, response.headers.get("x-gateway-backend")
                for text in response.iter_text():
                    self.body += text
                    self.words = self.body.count("word")
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.done.set()


@dataclass
class DyingPool:
    server: ProcessServer
    url: str


@pytest.fixture
def dying_pool(tmp_path: Path) -> Iterator[DyingPool]:
    """pool-a: a real emulator process at its real speed, to be SIGKILLed by the test."""
    port = free_port()
    args = python_module(
        "gateway", "emulate", "--profile", "b300-vllm", "--port", str(port), "--time-scale", "1"
    )
    server = ProcessServer(args, log_path=str(tmp_path / "pool-a.log")).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health")
        yield DyingPool(server, url)
    finally:
        server.stop()


def kill(server: ProcessServer) -> None:
    assert server.proc is not None and server.proc.poll() is None, "pool-a died before the kill"
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)


def test_many_streams_in_flight_when_their_backend_is_killed(
    upstreams: Upstreams,
    second_pool: ThreadedServer,
    dying_pool: DyingPool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool_a = dying_pool.url
    set_faults(pool_a, reasoning_tokens=0, content_tokens=WORDS)
    httpx.delete(second_pool.url + "/emulator/faults")
    set_faults(second_pool.url, reasoning_tokens=0, content_tokens=WORDS)
    upstreams.reset()
    set_faults(upstreams.paid.url, reasoning_tokens=0, content_tokens=WORDS)
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(
        policy(pool_a, second_pool.url, upstreams.paid.url) + "ledger: {flush_interval_s: 0.05}\n"
    )
    try:
        with running_gateway(path) as gateway:
            check_the_kill(gateway, dying_pool.server, dying_pool.url)
    finally:
        upstreams.reset()
        httpx.delete(second_pool.url + "/emulator/faults")


def arrived(url: str) -> list[object]:
    return [r for r in httpx.get(url + "/emulator/requests").json() if r["path"].endswith("completions")]


def check_the_kill(gateway: Gateway, dying_pool: ProcessServer, pool_a: str) -> None:
    readers = [Reader("two-pools") for _ in range(RESUMABLE)] + [
        Reader("cannot-resume") for _ in range(CANNOT)
    ]
    threads = [threading.Thread(target=r.run, args=(gateway.base_url,), daemon=True) for r in readers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while not all(r.words >= WORDS_BEFORE_KILL for r in readers):  # tokens flow on every stream
        assert not any(r.done.is_set() for r in readers), [(r.route, r.error, r.body[-200:]) for r in readers]
        assert time.monotonic() < deadline, [r.words for r in readers]
        time.sleep(0.01)
    # The next requests wait at pool-a for a first token that will not come before the kill.
    set_faults(pool_a, added_ttft_ms=60_000)
    waiting = [Reader("two-pools") for _ in range(WAITING)]
    threads += [threading.Thread(target=r.run, args=(gateway.base_url,), daemon=True) for r in waiting]
    for thread in threads[len(readers) :]:
        thread.start()
    eventually(lambda: len(arrived(pool_a)) == len(readers) + WAITING, timeout=30)
    kill(dying_pool)
    # Sent after the kill: pool-a refuses, or its circuit is open already; either way pool-b answers.
    late = [
        httpx.post(
            gateway.base_url + "/chat/completions",
            json={"model": "two-pools", "messages": HELLO, "stream": stream, "max_tokens": 20},
            timeout=60,
        )
        for stream in (False, True, False, True)
    ]
    for thread in threads:
        thread.join(120)

    for reader in readers:
        assert reader.error is None and reader.status == 200 and reader.backend == "pool-a", reader.error
        events = sse_events(reader.body)
        chunks = [e for e in events if isinstance(e, dict) and "choices" in e]
        assert len({c["id"] for c in chunks}) == 1, "one stream id throughout"
        text = stream_text(events, "content")
        if reader.route == "two-pools":
            assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
            assert text == numbered("word", WORDS), "each word exactly once, in order, across the kill"
            (usage,) = [c for c in chunks if c.get("usage")]
            assert usage["x_gateway_resumed"][0]["to"] == "pool-b"
        else:
            assert "[DONE]" not in events and events[-1]["error"]["code"] == "upstream_stream_broken"
            words = text.split()
            assert WORDS_BEFORE_KILL <= len(words) < WORDS and text == numbered("word", len(words))
    for reader in waiting:
        assert reader.error is None and reader.status == 200 and reader.backend == "pool-b", reader.error
        events = sse_events(reader.body)
        assert events[-1] == "[DONE]" and stream_text(events, "content") == numbered("word", WORDS)
    for response in late:
        assert response.status_code == 200 and response.headers["x-gateway-backend"] == "pool-b", (
            response.text
        )
        assert '"error"' not in response.text

    total = len(readers) + len(waiting) + len(late)
    ledger = gateway.policy_path.parent / "ledger.sqlite3"
    deadline = time.monotonic() + 30
    while not (ledger.exists() and len(ledger_rows(ledger)) >= total):
        assert time.monotonic() < deadline, "a request has no ledger row"
        time.sleep(0.05)
    rows = ledger_rows(ledger)
    assert len(rows) == total, "one row per request, no more"
    logs = [[(a["backend"], a["status"], a["resumed"]) for a in orjson.loads(r["attempt_log"])] for r in rows]
    resumed = [log for log in logs if log == [("pool-a", "dropped", None), ("pool-b", "ok", "continued")]]
    broken = [log for log in logs if log == [("pool-a", "dropped", None)]]
    before_a_byte = [
        log for log in logs if len(log) == 2 and log[0][1] != "ok" and log[1] == ("pool-b", "ok", None)
    ]
    fell_back = [log for log in logs if log[-1][:2] == ("pool-b", "ok") and log[-1][2] is None]
    assert len(resumed) == RESUMABLE and len(broken) == CANNOT, logs
    assert len(before_a_byte) >= WAITING and len(fell_back) == WAITING + len(late), logs
    second_attempts = sum(1 for log in logs if len(log) > 1)
    print(f"{total} requests, {second_attempts} needed a second attempt ({len(resumed)} resumed mid-stream)")
    assert second_attempts == RESUMABLE + len(before_a_byte), logs
    errors = {r["error_type"] for r in rows if r["status"] != "ok"}
    assert [r["status"] for r in rows].count("ok") == RESUMABLE + WAITING + len(late), rows
    assert errors == {"dropped"}, errors
