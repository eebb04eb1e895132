"""`gateway demo` behind a relay that writes down every exchange (on free ports, its ledger in a temp
folder), for the tests that must show every request a real client sent was answered 2xx. The clients
themselves are installed from npm by the setup scripts here (cached outside the repo)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clients.relay import Relay
from tests.servers import free_port, threaded_server
from tests.test_demo import policy_on_ports, start_demo

REPO = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("GATEWAY_CACHE") or Path.home() / ".cache" / "gateway")


@dataclass
class RelayedDemo:
    url: str  # the relay's: what the client is told
    gateway_url: str
    relay: Relay
    folder: Path

    def ledger(self) -> Path:
        (path,) = self.folder.glob("**/ledger.sqlite3")
        return path


@pytest.fixture(scope="module")
def relayed_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayedDemo]:
    """`gateway demo` on the default policy (its emulator ports moved to free ones), emulators 50x faster."""
    folder = tmp_path_factory.mktemp("demo")
    policy = policy_on_ports(folder, (free_port(), free_port(), free_port()))
    port = free_port()
    server, _ = start_demo(folder, policy, port)
    try:
        relay = Relay(f"http://127.0.0.1:{port}")
        with threaded_server(relay.app()) as relayed:
            yield RelayedDemo(relayed.url, f"http://127.0.0.1:{port}", relay, folder)
    finally:
        server.stop()
