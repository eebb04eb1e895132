"""A stream is in the books once its client has it, whatever the upstream does with its last bytes.

An upstream sends ``data: [DONE]`` and then holds its chunked terminator (``0\\r\\n\\r\\n``), as a slow
or stalled engine may: the gateway ends the client's response at [DONE], and its row must be in the
ledger while the upstream still holds those bytes. Before, the relay read them first (up to
``DRAIN_TIMEOUT_S``), and only then settled, so a crash or a kill in that window lost the row of an
answer the client already had. The upstream's connection is still read to its end and kept."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.request import streaming
from tests.conftest import running_gateway
from tests.hardening.test_one_read_stream import (
    STREAM_HEAD,
    OneWriteUpstream,
    chunked,
    frame,
    one_backend_policy,
    read_request,
    usage_frame,
)
from tests.replicas.conftest import eventually


class HeldEndUpstream(OneWriteUpstream):
    """A keep-alive upstream that answers each request with a whole stream, [DONE] included, and sends
    the chunked terminator only once the test ``release``s it."""

    def __init__(self) -> None:
        super().__init__()
        self.connections = 0
        self.ended = 0  # terminators sent
        self._release = asyncio.Event()  # bound to the upstream's loop when first waited on

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self._release.set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await read_request(reader)
                events = frame("held") + usage_frame() + b"data: [DONE]\n\n"
                writer.write(STREAM_HEAD + chunked(events))
                await writer.drain()
                await self._release.wait()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                self.ended += 1
        writer.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        with super().running() as url:
            try:
                yield url
            finally:
                self.release()  # a stream still held (a failed test) ends with its connection


def ledger_request_ids(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        return {request_id for (request_id,) in conn.execute("SELECT request_id FROM requests")}


def test_a_stream_is_in_the_ledger_while_its_upstream_still_holds_its_last_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Longer than the test waits for the row: the row must not wait for the drain's timeout either.
    monkeypatch.setattr(streaming, "DRAIN_TIMEOUT_S", 120.0)
    upstream = HeldEndUpstream()
    with upstream.running() as url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(one_backend_policy(url, "held", "ledger: {flush_interval_s: 0.05}\n"))
        with running_gateway(policy) as gateway, httpx.Client(timeout=60) as client:
            body = {"model": "held", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            answer = client.post(
                gateway.base_url + "/chat/completions", json=body, headers={"x-request-id": "held-1"}
            )
            assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
            ledger = tmp_path / "ledger.sqlite3"
            eventually(lambda: "held-1" in ledger_request_ids(ledger), timeout=30)
            assert upstream.ended == 0, "the row was written while the upstream held its last bytes"

            # Released, the upstream's answer is read to its end and its connection kept for the next.
            upstream.release()
            eventually(lambda: not gateway.runtime.drain.streams, timeout=30)
            assert upstream.ended == 1
            again = client.post(
                gateway.base_url + "/chat/completions", json=body, headers={"x-request-id": "held-2"}
            )
            assert again.status_code == 200 and again.text.endswith("data: [DONE]\n\n")
            eventually(lambda: "held-2" in ledger_request_ids(ledger), timeout=30)
    assert upstream.connections == 1, "the drained connection was reused"
