"""Proxies and per-backend TLS, for real on loopback: a small CONNECT proxy, an https upstream whose
certificate a throw-away CA (trustme) signed, and the gateway configured with that CA per backend
and ``HTTPS_PROXY`` in its environment. Also what happens without the CA, with ``trust_env: false``,
with NO_PROXY, through the proxy to an http origin (absolute-form), and with the proxy down."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from gateway.backends.base import UpstreamCall
from gateway.backends.openai_compat import OpenAICompatClient
from gateway.errors import AttemptFailure
from gateway.policy.load import compile_policy_text
from tests.conftest import running_gateway

ANSWER = (
    b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"through the tunnel"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}'
)


def answer_bytes() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
        + ANSWER
    )


class Upstream:
    """An OpenAI-ish upstream on loopback, https when given a context; records request heads."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.tls = tls
        self.heads: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Upstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.heads.append(head)
                writer.write(answer_bytes())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        assert self._server is not None
        self._server.close()


class ConnectProxy:
    """An HTTP proxy: CONNECT opens a tunnel to the target; any other request is answered by the
    proxy itself (recorded), as if it had forwarded it."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []  # the request line of everything it was asked
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0]
            self.lines.append(line)
            method, target, _ = line.split(b" ")
            if method != b"CONNECT":
                length = next(
                    (
                        int(h.split(b":")[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(answer_bytes())
                await writer.drain()
                return
            host, port = target.rsplit(b":", 1)
            up_reader, up_writer = await asyncio.open_connection(host.decode(), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        assert self._server is not None
        self._server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "backend-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
async def https_upstream(ca: trustme.CA) -> AsyncIterator[Upstream]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    upstream = await Upstream(context).start()
    yield upstream
    upstream.close()


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    proxy = await ConnectProxy().start()
    yield proxy
    proxy.close()


def policy_text(url: str, extra: str = "") -> str:
    return f"""
backends:
  secure:
    dialect: openai
    url: {url}
    model: m
{extra}    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}}}
    timeouts: {{connect_s: 5, first_byte_s: 5}}
routes:
  chat:
    backends: [secure]
"""


def call_for(text: str, source: Path) -> UpstreamCall:
    backend = compile_policy_text(text, str(source)).backends["secure"]
    return UpstreamCall(backend, "/chat/completions", b'{"model":"chat"}', stream=False, wait_s=5.0)


async def open_and_read(client: OpenAICompatClient, call: UpstreamCall) -> bytes:
    upstream = await client.open(call)
    try:
        return await upstream.read(5.0)
    finally:
        upstream.close()


@contextlib.contextmanager
def closing_client(environ: dict[str, str]) -> Iterator[OpenAICompatClient]:
    client = OpenAICompatClient(environ=environ)
    try:
        yield client
    finally:
        client._wire.close()


async def test_https_through_a_connect_proxy_with_the_backends_own_ca(
    https_upstream: Upstream, proxy: ConnectProxy, ca_file: Path, tmp_path: Path
) -> None:
    url = f"https://localhost:{https_upstream.port}/v1"
    call = call_for(policy_text(url, f"    tls: {{ca_file: {ca_file.name}}}\n"), tmp_path / "policy.yaml")
    with closing_client({"HTTPS_PROXY": f"http://127.0.0.1:{proxy.port}"}) as client:
        assert await open_and_read(client, call) == ANSWER
        assert await open_and_read(client, call) == ANSWER  # the tunnelled connection is kept alive
    assert proxy.lines == [b"CONNECT localhost:%d HTTP/1.1" % https_upstream.port]
    assert len(https_upstream.heads) == 2


async def test_without_the_ca_the_failure_says_the_certificate_did_not_verify(
    https_upstream: Upstream, proxy: ConnectProxy, tmp_path: Path
) -> None:
    call = call_for(policy_text(f"https://localhost:{https_upstream.port}/v1"), tmp_path / "policy.yaml")
    environ = {"HTTPS_PROXY": f"http://127.0.0.1:{proxy.port}"}
    with closing_client(environ) as client, pytest.raises(AttemptFailure) as failed:
        await open_and_read(client, call)
    assert failed.value.kind == "connect_error"
    assert "certificate verif" in str(failed.value)


async def test_trust_env_false_and_no_proxy_go_direct(
    https_upstream: Upstream, proxy: ConnectProxy, ca_file: Path, tmp_path: Path
) -> None:
    url = f"https://localhost:{https_upstream.port}/v1"
    tls = f"    tls: {{ca_file: {ca_file.name}}}\n"
    environ = {"HTTPS_PROXY": f"http://127.0.0.1:{proxy.port}"}
    direct = call_for(policy_text(url, tls + "    trust_env: false\n"), tmp_path / "policy.yaml")
    with closing_client(environ) as client:
        assert await open_and_read(client, direct) == ANSWER
    bypassed = call_for(policy_text(url, tls), tmp_path / "policy.yaml")
    with closing_client({**environ, "NO_PROXY": "example.com,localhost"}) as client:
        assert await open_and_read(client, bypassed) == ANSWER
    assert proxy.lines == [] and len(https_upstream.heads) == 2


async def test_http_through_the_proxy_is_sent_in_absolute_form(proxy: ConnectProxy, tmp_path: Path) -> None:
    call = call_for(policy_text("http://backend.internal:8000/v1"), tmp_path / "policy.yaml")
    with closing_client({"http_proxy": f"http://user:pw@127.0.0.1:{proxy.port}"}) as client:
        assert await open_and_read(client, call) == ANSWER
    assert proxy.lines == [b"POST http://backend.internal:8000/v1/chat/completions HTTP/1.1"]


async def test_a_proxy_that_is_down_is_named_as_the_failure(proxy: ConnectProxy, tmp_path: Path) -> None:
    port = proxy.port
    proxy.close()
    await asyncio.sleep(0)
    call = call_for(policy_text("https://api.example.com/v1"), tmp_path / "policy.yaml")
    environ = {"HTTPS_PROXY": f"http://127.0.0.1:{port}"}
    with closing_client(environ) as client, pytest.raises(AttemptFailure) as failed:
        await open_and_read(client, call)
    assert failed.value.kind == "connect_error"
    assert f"proxy 127.0.0.1:{port}: connection refused" in str(failed.value)


async def test_the_gateway_behind_a_connect_proxy_reaches_an_https_backend(
    https_upstream: Upstream,
    proxy: ConnectProxy,
    ca_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    path = tmp_path / "policy.yaml"
    url = f"https://localhost:{https_upstream.port}/v1"
    path.write_text(policy_text(url, f"    tls: {{ca_file: {ca_file.name}}}\n"))
    with running_gateway(path) as gateway:
        async with httpx.AsyncClient(base_url=gateway.base_url, trust_env=False, timeout=10.0) as http:
            response = await http.post(
                "/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
            )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "through the tunnel"
    # Every connection to the backend went through the tunnel (a probe may have opened its own).
    assert set(proxy.lines) == {b"CONNECT localhost:%d HTTP/1.1" % https_upstream.port}
    assert https_upstream.heads


async def test_the_signal_gets_reach_a_backend_with_its_own_ca(
    https_upstream: Upstream, ca_file: Path, tmp_path: Path
) -> None:
    url = f"https://localhost:{https_upstream.port}/v1"
    text = policy_text(url, f"    tls: {{ca_file: {ca_file.name}}}\n")
    backend = compile_policy_text(text, str(tmp_path / "policy.yaml")).backends["secure"]
    with closing_client({}) as client:
        fetched = await client.fetch(f"https://localhost:{https_upstream.port}/metrics", None, 5.0, backend)
        assert fetched.status == 200, fetched.error
        unknown = await client.fetch(f"https://localhost:{https_upstream.port}/metrics", None, 5.0)
        assert unknown.status is None and "certificate verif" in unknown.error
