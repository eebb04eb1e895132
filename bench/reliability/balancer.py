"""A small load balancer on loopback, as a Kubernetes Service with readiness behaves: each connection
goes to the next replica whose ``/ready`` last answered 200 (polled every ``poll_s``), and a connection
refused there is tried on the next one. It balances connections, not requests (kube-proxy is L4 too):
clients open one per request. It counts what it did, so a rolling restart can be judged."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

import httpx

PLACE_WAIT_S = 10.0  # how long a connection waits for some replica to be ready before it is dropped


@dataclass
class Counts:
    connections: int = 0
    retried: int = 0  # connections refused by one replica and placed on another
    unplaced: int = 0  # connections no replica took (the client sees its connection closed)
    by_replica: dict[int, int] = field(default_factory=dict)


class Balancer:
    def __init__(self, ports: list[int], poll_s: float = 0.1) -> None:
        self.ports = ports
        self.ready = {port: False for port in ports}
        self.counts = Counts()
        self._poll_s = poll_s
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._poller: asyncio.Task[None] | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def wait_ready(self, port: int, timeout_s: float = 60.0) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.ready[port]:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(self._poll_s)
        return True

    async def _poll(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                for port in self.ports:
                    try:
                        answer = await client.get(f"http://127.0.0.1:{port}/ready")
                        self.ready[port] = answer.status_code == 200
                    except httpx.HTTPError:
                        self.ready[port] = False
                await asyncio.sleep(self._poll_s)

    def _candidates(self) -> list[int]:
        ready = [port for port in self.ports if self.ready[port]]
        if not ready:
            return []
        start = next(self._turn) % len(ready)
        return ready[start:] + ready[:start]

    async def _connect(self) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PLACE_WAIT_S
        while loop.time() < deadline:
            for i, port in enumerate(self._candidates()):
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    continue  # refused: a replica that just stopped listening; try the next
                if i:
                    self.counts.retried += 1
                return port, reader, writer
            await asyncio.sleep(self._poll_s)
        return None

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.counts.connections += 1
        placed = await self._connect()
        if placed is None:
            self.counts.unplaced += 1
            client_writer.close()
            return
        port, upstream_reader, upstream_writer = placed
        self.counts.by_replica[port] = self.counts.by_replica.get(port, 0) + 1
        loop = asyncio.get_running_loop()
        pipes = [
            loop.create_task(pipe(client_reader, upstream_writer)),
            loop.create_task(pipe(upstream_reader, client_writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or a reset, then close the other side: a hang-up travels on, as through a proxy."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
