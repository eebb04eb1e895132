"""The agent clients' tests run against `gateway demo` as a newcomer starts it (the default policy, the
three emulators), one per test, on free ports."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients.relayed_demo import relayed_demo  # noqa: F401 (a fixture, found by pytest here)
from tests.servers import ProcessServer, free_port
from tests.test_demo import policy_on_ports, start_demo


@dataclass
class Demo:
    url: str  # the gateway, http://127.0.0.1:PORT
    emulators: list[str]
    folder: Path

    def answered(self) -> int:
        """Requests the gateway has settled, by its own count (``gateway_requests_total``)."""
        metrics = httpx.get(self.url + "/metrics").text
        lines = (line for line in metrics.splitlines() if line.startswith("gateway_requests_total{"))
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines)

    def ledger_rows(self, timeout_s: float = 30.0) -> list[sqlite3.Row]:
        """Every settled request's row: the ledger is written in batches off the request path, so this
        waits until it holds as many rows as the gateway counted."""
        expected, deadline = self.answered(), time.monotonic() + timeout_s
        while True:
            with sqlite3.connect(self.folder / "var" / "ledger.sqlite3") as ledger:
                ledger.row_factory = sqlite3.Row
                rows = list(ledger.execute("SELECT * FROM requests ORDER BY rowid"))
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)

    def errors_returned(self) -> list[str]:
        """Error responses the gateway counted (``gateway_errors_total``), by origin and code."""
        metrics = httpx.get(self.url + "/metrics").text
        return [
            line
            for line in metrics.splitlines()
            if line.startswith("gateway_errors_total{") and float(line.rsplit(" ", 1)[1]) > 0
        ]

    def upstream_bodies(self) -> list[dict[str, Any]]:
        """The chat requests the emulated backends received, oldest first."""
        seen = []
        for url in self.emulators:
            for request in httpx.get(url + "/emulator/requests").json():
                if request["path"].endswith("/chat/completions") and isinstance(request["body"], dict):
                    seen.append((request["received_at_s"], request["body"]))
        return [body for _, body in sorted(seen, key=lambda pair: pair[0])]


@contextlib.contextmanager
def running_demo(folder: Path, extra_routes: str = "") -> Iterator[Demo]:
    """`gateway demo --quiet` on free ports, with its default policy plus ``extra_routes`` (YAML)."""
    ports = (free_port(), free_port(), free_port())
    port = free_port()
    policy = policy_on_ports(folder, ports)
    policy.write_text(policy.read_text().replace("\nroutes:\n", "\nroutes:\n" + extra_routes, 1))
    process: ProcessServer
    process, _ = start_demo(folder, policy, port, "--quiet")
    try:
        yield Demo(f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{p}" for p in ports], folder)
    finally:
        process.stop()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    with running_demo(tmp_path) as running:
        yield running
