"""Real Redis servers of the tests' own (never the machine's shared one) and gateway replicas as
``python -m gateway serve`` subprocesses, each with its own ledger, all stopped by pid."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY
from tests.servers import ProcessServer, free_port, python_module, wait_http

ADMIN_KEY = "gwk-fleet-admin-0123456789abcdefghijklmnopqrstuvwxyzAB"
HELLO = [{"role": "user", "content": "Say hello"}]


class RedisServer:
    """A redis-server of this test's own on a free loopback port, without persistence: a restart
    loses everything, as a crashed cache would."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    client.ping()
                return self
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    server = RedisServer(workdir).start()
    try:
        yield server
    finally:
        server.stop()


def key_prefix() -> str:
    """A prefix no other test shares, so each one sees only its own keys."""
    return f"t{uuid.uuid4().hex[:10]}:"


@dataclass
class Replica:
    process: ProcessServer
    port: int
    ledger: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **params: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.get(self.url + path, params=params, headers=headers, timeout=10)

    def ready(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/ready").json()
        return body


def start_replicas(
    policy: Path, redis_url: str | None, tmp: Path, count: int, ledger_url: str | None = None, **extra: str
) -> list[Replica]:
    """``count`` gateway processes over ``policy``, started together, each with its own ledger file
    unless they share the PostgreSQL ledger at ``ledger_url``."""
    replicas = []
    for i in range(count):
        port = free_port()
        ledger, log = tmp / f"ledger-{i}.sqlite3", tmp / f"replica-{i}.log"
        args = ["gateway", "--log-level", "warning", "serve", "--policy", str(policy), "--port", str(port)]
        args += ["--ledger", ledger_url or str(ledger)]
        if redis_url is not None:
            args += ["--redis-url", redis_url]
        for flag, value in extra.items():
            args += [f"--{flag}", value]
        env = {"TEST_PAID_API_KEY": PAID_KEY, "GATEWAY_REDIS_URL": ""}
        process = ProcessServer(python_module(*args), env=env, log_path=str(log)).start()
        replicas.append(Replica(process, port, ledger, log))
    for replica in replicas:
        wait_http(replica.url + "/health", timeout=60)
    return replicas


def stop_replicas(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.process.stop()


def ledger_rows(path: Path, where: str = "1") -> list[sqlite3.Row]:
    if not path.exists():
        return []
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(f"SELECT * FROM requests WHERE {where}"))
    except sqlite3.OperationalError:  # the writer has not created the table yet
        return []
    finally:
        conn.close()


def eventually(check: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """``check()``'s first truthy result, trying until ``timeout``; the last failure if none."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            failure: BaseException | None = None
        except AssertionError as exc:
            failure = exc
        if time.monotonic() > deadline:
            if failure is not None:
                raise failure
            raise AssertionError(f"{getattr(check, '__name__', 'check')} stayed false for {timeout}s")
        time.sleep(interval)


def auth_yaml(*extra_keys: str) -> str:
    keys = "".join(f"\n    - {entry}" for entry in extra_keys)
    return f"""
auth:
  keys:
    - {{name: fleet-admin, sha256: {digest_of(ADMIN_KEY)}, admin: true}}{keys}
"""


def counter(client: redis.Redis, prefix: str, logical: str) -> tuple[float, float]:
    """A budget counter as Redis holds it: (spent, reserved)."""
    spent, reserved = client.hmget(f"{prefix}{{admission}}:{logical}", ["spent", "reserved"])
    return float(spent or 0.0), float(reserved or 0.0)


@pytest.fixture
def prefix() -> str:
    return key_prefix()
