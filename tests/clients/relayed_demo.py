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
from tests.servers import ProcessServer, free_port, python_module, threaded_server, wait_http

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PORTS = (8101, 8102, 8103)


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
    text = (REPO / "policies" / "default.yaml").read_text()
    for default in DEFAULT_PORTS:
        text = text.replace(f"127.0.0.1:{default}", f"127.0.0.1:{free_port()}")
    policy = folder / "policy.yaml"
    policy.write_text(text)
    port = free_port()
    args = python_module(
        "gateway", "demo", "--policy", str(policy), "--port", str(port), "--time-scale", "0.02"
    )
    server = ProcessServer(args, log_path=str(folder / "demo.log"), cwd=str(folder)).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=60)
        relay = Relay(f"http://127.0.0.1:{port}")
        with threaded_server(relay.app()) as relayed:
            yield RelayedDemo(relayed.url, f"http://127.0.0.1:{port}", relay, folder)
    finally:
        server.stop()
