"""Real servers for tests: an ASGI app on a loopback port in a thread, or a command in a subprocess.

Subprocesses are stopped by their process id (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, ok_statuses: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2.0).status_code in ok_statuses:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer in {timeout}s ({last})")


class ThreadedServer:
    """Runs an ASGI app with uvicorn in a background thread with its own event loop."""

    def __init__(
        self,
        app: Any,
        port: int | None = None,
        server_cls: type[uvicorn.Server] = uvicorn.Server,
        http: Any = "auto",
    ) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", http=http
        )
        self.server = server_cls(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server thread failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def threaded_server(app: Any, port: int | None = None, http: Any = "auto") -> Iterator[ThreadedServer]:
    """``http``: uvicorn's protocol, or a factory of one (the gateway's own: ``guarded_protocol``)."""
    server = ThreadedServer(app, port, http=http).start()
    try:
        yield server
    finally:
        server.stop()


class ProcessServer:
    """A command in its own process group; stopped by pid."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        log_path: str | None = None,
        cwd: str | None = None,
    ):
        self.args = args
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ProcessServer:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd
        )
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=timeout)


def python_module(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]
