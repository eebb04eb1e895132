"""Operator config on its way to a request head, checked at load: a key with a trailing newline (as
Kubernetes secrets have) is stripped, one with CR/LF inside is refused with file:line, a non-latin-1
path is percent-encoded, an IDN host punycoded, a query kept. And the pool's own bounds: a cap on
connections per origin with a queue, idle connections reaped, an https -> http redirect refused;
and how it connects: happy eyeballs over a dead address, DNS answers cached for their TTL."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest
import trustme

from gateway.backends import wire, wire_dial
from gateway.backends.openai_compat import OpenAICompatClient
from gateway.backends.wire import WirePool
from gateway.policy.document import PolicyError
from gateway.policy.load import compile_policy_text
from tests.backends.test_wire import RawServer, answer, head_for, read_request
from tests.backends.test_wire_proxy import ConnectProxy, call_for, closing_client, open_and_read, policy_text


async def test_a_key_with_a_trailing_newline_is_stripped(tmp_path: Path) -> None:
    heads: list[bytes] = []

    async def records(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
            writer.write(answer(b"{}"))
            await writer.drain()

    async with RawServer(records) as server:
        text = policy_text(f"http://127.0.0.1:{server.port}/v1", "    api_key_env: TEST_KEY\n")
        backend = compile_policy_text(text, "p.yaml", environ={"TEST_KEY": "sk-abc\n"}).backends["secure"]
        assert backend.api_key == "sk-abc"
        with closing_client({}) as client:
            call = call_for(text, tmp_path / "p.yaml")
            call = type(call)(backend, call.path, call.body, call.stream, call.wait_s)
            assert await open_and_read(client, call) == b"{}"
    assert b"authorization: Bearer sk-abc\r\n" in heads[0]


@pytest.mark.parametrize("key", ["sk-abc\r\nx-injected: 1", "sk-\x00abc", "sk-ключ"])
def test_a_key_that_would_break_the_head_is_a_load_error_with_its_line(key: str) -> None:
    text = policy_text("http://127.0.0.1:9/v1", "    api_key_env: TEST_KEY\n")
    with pytest.raises(PolicyError) as failed:
        compile_policy_text(text, "p.yaml", environ={"TEST_KEY": key})
    assert "p.yaml:7:5 backends.secure.api_key_env" in str(failed.value) and "TEST_KEY" in str(failed.value)
    assert key not in str(failed.value)  # never print a credential


def test_a_url_with_a_line_break_is_a_load_error() -> None:
    with pytest.raises(PolicyError) as failed:
        compile_policy_text(policy_text('"http://127.0.0.1:9/v1\\r\\nx-injected: 1"'), "p.yaml")
    assert "p.yaml:5:" in str(failed.value) and "control characters" in str(failed.value)


async def test_idn_host_encoded_path_and_query_reach_the_head(tmp_path: Path) -> None:
    proxy = await ConnectProxy().start()
    try:
        call = call_for(
            policy_text("http://bücher.example:8000/vé/?api-version=2024-10"), tmp_path / "p.yaml"
        )
        assert call.backend.base_url == "http://xn--bcher-kva.example:8000/v%C3%A9?api-version=2024-10"
        with closing_client({"HTTP_PROXY": f"http://127.0.0.1:{proxy.port}"}) as client:
            await open_and_read(client, call)
    finally:
        proxy.close()
    assert proxy.lines == [
        b"POST http://xn--bcher-kva.example:8000/v%C3%A9/chat/completions?api-version=2024-10 HTTP/1.1"
    ]


async def test_connections_per_origin_are_capped_and_requests_queue() -> None:
    open_now = 0
    most = 0

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        try:
            while True:
                body = await read_request(reader)
                await asyncio.sleep(0.05)
                writer.write(answer(body))
                await writer.drain()
        finally:
            open_now -= 1

    pool = WirePool()
    try:
        async with RawServer(slow) as server:
            origin = server.origin()

            async def one(n: int) -> bytes:
                response = await pool.post(origin, head_for(origin), b"%d" % n, 5.0, max_connections=2)
                try:
                    return await response.read()
                finally:
                    response.close()

            bodies = await asyncio.gather(*(one(n) for n in range(8)))
        assert bodies == [b"%d" % n for n in range(8)]
        assert server.connections == 2 and most == 2
    finally:
        pool.close()


async def test_idle_connections_are_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "IDLE_KEEP_S", 0.1)
    closed = asyncio.Event()

    async def notes_the_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        writer.write(answer(body))
        await writer.drain()
        await reader.read()  # b"" once the client closes
        closed.set()

    pool = WirePool()
    try:
        async with RawServer(notes_the_close) as server:
            origin = server.origin()
            response = await pool.post(origin, head_for(origin), b"1", 5.0)
            assert await response.read() == b"1"
            response.close()
            async with asyncio.timeout(30):  # event-driven: the reaper closes it, no request needed
                await closed.wait()
    finally:
        pool.close()


async def test_a_redirect_from_https_to_http_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the process default, as for the signal GETs
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    plain_heads: list[bytes] = []

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        plain_heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with RawServer(plain) as http_server:

        async def downgrades(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            location = b"http://localhost:%d/metrics" % http_server.port
            writer.write(b"HTTP/1.1 301 Moved\r\nlocation: " + location + b"\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(downgrades, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        client = OpenAICompatClient(environ={})
        try:
            fetched = await client.fetch(
                f"https://localhost:{port}/metrics", {"Authorization": "Bearer k"}, 5.0
            )
        finally:
            await client.close()
            server.close()
    assert fetched.status is None and fetched.error.startswith("InsecureRedirect")
    assert plain_heads == []


async def test_happy_eyeballs_starts_the_next_address_while_the_first_hangs() -> None:
    """An address that never answers (a dead IPv6 route, say) must not hold the connection up: the next
    address is tried after a short delay and the first to connect wins; the loser is cancelled."""
    started: list[str] = []
    hung = asyncio.Event()

    async def attempt(info: tuple[object, ...]) -> str:
        started.append(str(info[4]))
        if info[4] == "dead":
            hung.set()
            await asyncio.Event().wait()  # never connects
        return "connected via " + str(info[4])

    infos: list[tuple[object, ...]] = [(0, 0, 0, "", "dead"), (0, 0, 0, "", "alive")]
    async with asyncio.timeout(30):
        assert await wire_dial._first_of(infos, attempt) == "connected via alive"
    assert started == ["dead", "alive"] and hung.is_set()


async def test_dns_answers_are_cached_for_their_ttl() -> None:
    now = [0.0]
    dialer = wire_dial.Dialer(clock=lambda: now[0])
    first = await dialer._resolve("localhost", 80)
    assert await dialer._resolve("localhost", 80) is first  # cached
    now[0] += wire_dial.DNS_TTL_S + 1
    assert await dialer._resolve("localhost", 80) is not first  # looked up again after the TTL
    assert await dialer._resolve("127.0.0.1", 80) == [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 80))
    ]
