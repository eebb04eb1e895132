"""Gateways with a ledger in the test's tmp dir and routes of the test's choosing, over the session's
emulators; helpers to send traffic and read the ledger back."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.money.budgets import period_bounds
from gateway.policy.reload import PolicyHolder
from gateway.runtime import Runtime
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml
from tests.servers import threaded_server

HELLO = [{"role": "user", "content": "Say hello"}]
MakeGateway = Callable[..., Gateway]


def spend_policy(up: Upstreams, ledger: Path, routes: str | None = None) -> str:
    """The shared test policy, its routes replaced, writing its ledger to ``ledger``."""
    return policy_yaml(up, routes) + f"ledger:\n  path: {ledger}\n  flush_interval_s: 0.05\n"


@pytest.fixture
def make_gateway(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MakeGateway]:
    """Start gateways on demand; each call may give other routes; all share the tmp ledger."""
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    with contextlib.ExitStack() as stack:

        def make(routes: str | None = None, policy_suffix: str = "", **runtime_options: Any) -> Gateway:
            path = tmp_path / "policy.yaml"
            path.write_text(spend_policy(upstreams, ledger_path(tmp_path), routes) + policy_suffix)
            holder = PolicyHolder(path)
            app = create_app(lambda: Runtime(holder, **runtime_options))
            return Gateway(stack.enter_context(threaded_server(app)), path)

        yield make
    upstreams.reset()


def clear_of_midnight(margin_s: float = 120.0) -> float:
    """The time now, at least ``margin_s`` from either end of its UTC day: waits out a day boundary
    that would fall between rows a test seeds a minute back and what it reads of today (a day's budget
    and the dashboard count from the day's start). Waits only within ``margin_s`` of midnight."""
    now = time.time()
    start, end = period_bounds("day", now)
    if now - start < margin_s or end - now < margin_s:
        time.sleep((start if now - start < margin_s else end) + margin_s - now)
        now = time.time()
    return now


def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"


def chat(gateway: Gateway, route: str, *, stream: bool = False, **extra: Any) -> httpx.Response:
    body = {"model": route, "messages": HELLO, "stream": stream, **extra}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)


async def chat_many(gateway: Gateway, route: str, count: int, **extra: Any) -> list[httpx.Response]:
    """``count`` requests at once, each on its own connection."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        body = {"model": route, "messages": HELLO, **extra}
        url = gateway.base_url + "/chat/completions"
        return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(count))))


def settle(gateway: Gateway, requests: int, timeout: float = 10.0) -> None:
    """Wait until ``requests`` have finished and every ledger row is on disk."""
    runtime = gateway.runtime
    deadline = time.monotonic() + timeout
    while runtime.ledger.rows_written < requests:
        if time.monotonic() > deadline:
            raise AssertionError(f"{runtime.ledger.rows_written} of {requests} ledger rows written")
        time.sleep(0.01)


def ledger_rows(path: Path, where: str = "1", params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(f"SELECT * FROM requests WHERE {where} ORDER BY id", params))
    finally:
        conn.close()
