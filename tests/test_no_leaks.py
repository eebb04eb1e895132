"""Nothing about the upstreams leaks to clients: no response header of any endpoint (answers, errors,
streams cut mid-way) names an upstream host or carries a backend credential, and the request log holds
no prompt text, even for a request whose upstream fails; and an upstream whose own error text names its
host, its key and a traceback has none of it reach a client, the ledger, /metrics or the dashboard."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.routing import Mount, Route

from gateway.api import admin, dashboard, openai
from gateway.values.auth import policy_line
from tests.conftest import PAID_KEY, Gateway, Upstreams, running_gateway
from tests.servers import threaded_server

DEAD_HOST = "upstream-host-a7c3e1.invalid"  # never resolves: every attempt there fails
ADMIN_KEY = "sk-leak-test-admin-key-0123456789"
PROMPT = "the-prompt-text-that-must-not-be-logged-5b8d"


@pytest.fixture
def leaky(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(f"""
backends:
  dead:
    dialect: vllm
    url: http://{DEAD_HOST}:8000/v1
    model: m
    pricing: {{gpu_hours: {{usd_per_hour: 1.0}}}}
    signals: {{metrics_url: http://{DEAD_HOST}:8000/metrics, health_url: http://{DEAD_HOST}:8000/health}}
    timeouts: {{first_byte_s: 2, idle_s: 1}}
  paid-api:
    dialect: openai
    url: {upstreams.paid.url}/v1
    model: kimi-k3
    api_key_env: TEST_PAID_API_KEY
    pricing: {{per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}}}
    timeouts: {{first_byte_s: 5, idle_s: 1}}
routes:
  kimi-k3:
    backends: [dead, paid-api]
    exploration: 0
  dead-only:
    backends: [dead]
  paid-only:
    backends: [paid-api]
    fallback: {{max_attempts: 1}}
auth:
  keys:
    {policy_line("ops", ADMIN_KEY, routes=[], admin=True)}
""")
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def secrets(upstreams: Upstreams) -> list[str]:
    hosts = [DEAD_HOST, upstreams.paid.url.split("//")[1]]  # host:port, never a bare number
    return [PAID_KEY, ADMIN_KEY, *hosts]


def leaks(response: httpx.Response, upstreams: Upstreams) -> list[str]:
    raw = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
    return [s for s in secrets(upstreams) if s.lower() in raw.lower()]


def chat(route: str, stream: bool) -> dict[str, object]:
    return {
        "model": route,
        "stream": stream,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 20,
    }


def every_get_path() -> list[str]:
    paths = [r.path for r in (*openai.routes, *admin.routes, *dashboard.routes) if isinstance(r, Route)]
    gets = [
        r.path
        for r in (*openai.routes, *admin.routes, *dashboard.routes)
        if isinstance(r, Route) and "GET" in (r.methods or ())
    ]
    statics = [f"{r.path}/dashboard.js" for r in dashboard.routes if isinstance(r, Mount)]
    assert len(paths) > 10
    return [*gets, *statics, "/no-such-path", "/admin/explain?route=kimi-k3"]


def test_no_response_header_names_an_upstream_or_carries_a_credential(
    leaky: Gateway, upstreams: Upstreams, caplog: pytest.LogCaptureFixture
) -> None:
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    seen: list[tuple[str, int]] = []
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=leaky.url, timeout=30) as client:
        responses = [client.get(path, headers=auth) for path in every_get_path()]
        responses += [client.get("/admin/policy")]  # no key: an error answer
        responses.append(client.post("/admin/policy/reload", headers=auth))
        for endpoint in ("/v1/chat/completions", "/chat/completions"):
            for route in ("kimi-k3", "dead-only", "paid-only", "no-such-route"):
                for stream in (False, True):
                    responses.append(client.post(endpoint, json=chat(route, stream), headers=auth))
        responses.append(client.post("/v1/chat/completions", content=b"{not json", headers=auth))
        responses.append(
            client.post("/v1/completions", json={"model": "dead-only", "prompt": PROMPT}, headers=auth)
        )
        # A stream the upstream cuts after its first frames: the client gets an SSE error event.
        httpx.post(upstreams.paid.url + "/emulator/faults", json={"drop_after_chunks": 2})
        with client.stream("POST", "/v1/chat/completions", json=chat("paid-only", True), headers=auth) as cut:
            body = cut.read().decode()
            responses.append(cut)
        assert cut.status_code == 200 and '"error"' in body, body
        assert not [s for s in secrets(upstreams) if s in body], body
    for response in responses:
        seen.append((str(response.request.url.path), response.status_code))
        assert not leaks(response, upstreams), (response.request.url, dict(response.headers))
        # Bodies too, but for the admin's own views, which show the backends' URLs to an admin key.
        if not response.request.url.path.startswith(("/admin", "/dashboard", "/metrics")):
            body_text = response.read().decode(errors="replace")
            assert not [s for s in secrets(upstreams) if s in body_text], (
                response.request.url,
                body_text[:300],
            )
    statuses = {status for _, status in seen}
    assert {200, 401, 404, 400} <= statuses, seen
    assert any(status >= 500 for _, status in seen), "some answer must be an upstream failure"
    # The request log of all that, failures included, never holds the prompt.
    assert caplog.records, "the failing requests logged something"
    assert not [r for r in caplog.records if PROMPT in r.getMessage()]


# --- an upstream whose own error text names its host, its key and its traceback -----------------------

CHATTY_HOST = "gpu-node-17.internal.example:8000"  # where the upstream says it runs
CHATTY_KEY = "sk-chatty-backend-key-9f2e4d1c"  # the key the gateway sends it, which it echoes
TRACEBACK = 'Traceback (most recent call last):\n  File "/srv/vllm/entrypoints/openai/serving.py", line 88'


class ChattyUpstream:
    """An upstream that fails in the chattiest way: each answer (an HTTP error, a 200 with an error
    body, or an SSE error event after a first token) carries its URL, its host name, the bearer key it
    was sent and a Python traceback, as a misconfigured server's debug mode does."""

    def __init__(self) -> None:
        self.status = 500
        self.stream_error = False  # a stream that starts, then sends an error event
        self.url = ""

    def leak_text(self, key: str) -> str:
        return f"failed at {self.url}/v1/chat/completions on {CHATTY_HOST} with key {key}\n{TRACEBACK}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        text = self.leak_text(auth.removeprefix("Bearer "))
        error = {"error": {"message": text, "type": "server_error", "code": CHATTY_HOST, "param": text}}
        if self.stream_error and orjson.loads(body or b"{}").get("stream"):
            first = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
            first["choices"] = [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            # The token first, on its own: an error in the very first read would be answered from
            # elsewhere (a 502 here), not relayed mid-stream. Then the error event and [DONE], as vLLM.
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(first) + b"\n\n",
                    "more_body": True,
                }
            )
            await asyncio.sleep(0.2)
            error_events = b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n"
            await send({"type": "http.response.body", "body": error_events})
            return
        headers = [(b"content-type", b"application/json"), (b"server", CHATTY_HOST.encode())]
        headers.append((b"x-upstream-url", self.url.encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": orjson.dumps(error)})


@pytest.fixture
def chatty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Gateway, ChattyUpstream]]:
    upstream = ChattyUpstream()
    monkeypatch.setenv("CHATTY_KEY", CHATTY_KEY)
    with threaded_server(upstream) as server:
        upstream.url = server.url
        path = tmp_path / "policy.yaml"
        path.write_text(f"""
backends:
  chatty:
    dialect: openai
    url: {server.url}/v1
    model: m
    api_key_env: CHATTY_KEY
    pricing: {{per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
routes:
  chatty:
    backends: [chatty]
    fallback: {{max_attempts: 1}}
    waiting: {{max_wait_s: 0}}  # after the 429, the pause is answered at once, not waited out
auth:
  keys:
    {policy_line("ops", ADMIN_KEY, routes=[], admin=True)}
ledger: {{flush_interval_s: 0.05}}
tuning:
  probes: {{enabled: false}}
  circuit: {{failure_threshold: 1000, min_volume: 1000}}  # every request meets the upstream
""")
        with running_gateway(path) as gateway:
            yield gateway, upstream


def chatty_secrets(upstream: ChattyUpstream) -> list[str]:
    host_port = upstream.url.split("//")[1]
    return [CHATTY_KEY, CHATTY_HOST, host_port, upstream.url, "Traceback", 'File "/srv', ADMIN_KEY]


def test_an_upstreams_own_error_text_never_reaches_the_client(
    chatty: tuple[Gateway, ChattyUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    """Every place a client, a scraper or a dashboard reads: the answer's headers and body, the ledger's
    rows, /metrics and /dashboard/data; and the logs at INFO hold no prompt."""
    gateway, upstream = chatty
    secrets = chatty_secrets(upstream)
    caplog.set_level(logging.INFO)
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    seen: list[tuple[int, str, str]] = []  # status, headers, body
    streamed_errors: list[str] = []  # the streams whose upstream sent an error event, per door
    with httpx.Client(base_url=gateway.url, timeout=30, headers=auth) as client:

        def ask(stream: bool, door: str = "/v1/chat/completions") -> None:
            payload = chat("chatty", stream)
            if door == "/v1/messages":  # Anthropic's Messages API: its own error shapes, same scrubbing
                payload = {
                    "model": "chatty",
                    "max_tokens": 20,
                    "stream": stream,
                    "messages": payload["messages"],
                }
            with client.stream("POST", door, json=payload) as response:
                body = response.read().decode(errors="replace")
                headers = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
                seen.append((response.status_code, headers, body))

        # 429 last: it pauses the backend (backpressure), and the route would wait out the pause.
        for status in (500, 502, 503, 400, 401, 404, 413, 422, 200, "stream error", 429):
            upstream.status, upstream.stream_error = (
                (200, True) if status == "stream error" else (status, False)
            )
            for stream in (False, True):
                for door in ("/v1/chat/completions", "/v1/messages"):
                    ask(stream, door)
                    if status == "stream error" and stream:
                        streamed_errors.append(seen[-1][2])
        deadline = time.monotonic() + 15
        while gateway.runtime.ledger.rows_written < len(seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        views = {path: client.get(path).text for path in ("/metrics", "/dashboard/data", "/admin/backends")}
    statuses = {status for status, _, _ in seen}
    assert {200, 400, 502} <= statuses, statuses
    for status, headers, body in seen:
        found = [s for s in secrets if s.lower() in (headers + body).lower()]
        assert not found, (status, found, body[:200], headers)
    chat_error, messages_error = streamed_errors
    assert '"hi"' in chat_error and '"error"' in chat_error, "the error still arrives, as an event"
    assert "event: error" in messages_error or '"error"' in messages_error, messages_error[-300:]

    with contextlib.closing(sqlite3.connect(gateway.policy_path.parent / "ledger.sqlite3")) as db:
        rows = [" ".join(map(str, row)) for row in db.execute("SELECT * FROM requests")]
    assert len(rows) == len(seen), "every request has its row"
    assert not [(s, r) for r in rows for s in secrets if s in r]
    for path, text in views.items():
        if path == "/admin/backends":
            continue  # an admin's view of the backends names their URLs by design; the key never
        assert not [s for s in secrets if s in text], (path, text[:300])
    assert CHATTY_KEY not in views["/admin/backends"]
    for path in views:  # admin-only by design: they name backends and spend
        assert httpx.get(gateway.url + path, timeout=10).status_code == 401, path
    assert not [r for r in caplog.records if PROMPT in r.getMessage()], "no prompt in the logs at INFO"
    assert not [r for r in caplog.records if CHATTY_KEY in r.getMessage()], "no backend key in the logs"
