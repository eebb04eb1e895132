"""A real upstream: llama.cpp's own C++ ``llama-server`` (what deploy/llamacpp runs) serving Gemma 3 270M
on the CPU, and a gateway routing to it with its signals scraped. `bash tests/real/setup_llamacpp.sh`
builds the server and fetches the model; until it has run these tests skip."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.demo import real_model_file, real_server_binary, real_server_command
from tests.conftest import Gateway, running_gateway
from tests.servers import ProcessServer, free_port

MODEL_FILE = real_model_file()
SERVED_MODEL = "gemma-3-270m-q4_k_m"
BACKEND = "gemma-llamacpp"
ROUTE = "gemma"
SETUP_COMMAND = "bash tests/real/setup_llamacpp.sh"
BOOT_TIMEOUT_S = 120.0
# Two slots: enough to see one busy and one idle, or a third request deferred, on two shared cores.
SLOTS = 2
CONTEXT_PER_SLOT = 2048


@dataclass
class LlamaServer:
    url: str
    log_path: Path
    process: ProcessServer

    def slots(self) -> list[dict[str, Any]]:
        reply = httpx.get(f"{self.url}/slots", timeout=10.0)
        reply.raise_for_status()
        slots: list[dict[str, Any]] = reply.json()
        return slots

    def metrics(self) -> str:
        reply = httpx.get(f"{self.url}/metrics", timeout=10.0)
        reply.raise_for_status()
        return reply.text


def missing_setup() -> str | None:
    if real_server_binary() is None:
        return "llama.cpp's llama-server is not built"
    if not MODEL_FILE.is_file():
        return f"the Gemma 3 270M GGUF is missing at {MODEL_FILE}"
    return None


def skip_without_setup() -> None:
    reason = missing_setup()
    if reason is not None:
        pytest.skip(f"{reason}: run `{SETUP_COMMAND}` to build and fetch the real llama.cpp upstream")


def start_llama_server(
    log_path: Path,
    *,
    slots: int = SLOTS,
    context_tokens: int = CONTEXT_PER_SLOT,
    extra_args: tuple[str, ...] = (),
) -> tuple[ProcessServer, str]:
    """A llama-server process on a free loopback port, ``extra_args`` appended to its command line; the
    caller stops it (by pid)."""
    binary = real_server_binary()
    assert binary is not None
    port = free_port()
    # One thread: on two cores shared with the test process (and, on a dev box, other work) two OpenMP
    # threads spin at every barrier for a core the other holds; measured: 3 tokens/s with two, 45 with one.
    command = real_server_command(
        binary, MODEL_FILE, SERVED_MODEL, port, slots=slots, context_tokens=context_tokens, threads=1
    )
    command += list(extra_args)
    return ProcessServer(command, log_path=str(log_path)).start(), f"http://127.0.0.1:{port}"


def wait_for_boot(server: ProcessServer, url: str, log_path: Path) -> None:
    """Until ``/health`` answers 200 (503 while the model loads); fails at once, with the server's log,
    if the process dies first."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while True:
        assert server.proc is not None
        if server.proc.poll() is not None:
            raise RuntimeError(f"llama-server exited ({server.proc.returncode}):\n{log_tail(log_path)}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"llama-server did not get ready at {url}:\n{log_tail(log_path)}")
        time.sleep(0.05)


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    skip_without_setup()
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    process, url = start_llama_server(log_path)
    try:
        wait_for_boot(process, url, log_path)
        yield LlamaServer(url, log_path, process)
    finally:
        process.stop()


def wait_slots_idle(server: LlamaServer, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Until no slot is processing: a test that leaves a slot busy must not skew the next one."""
    deadline = time.monotonic() + timeout
    while True:
        slots = server.slots()
        if not any(slot["is_processing"] for slot in slots):
            return slots
        if time.monotonic() > deadline:
            raise AssertionError(f"slots still busy after {timeout:g}s: {slots}")
        time.sleep(0.05)


def policy_yaml(upstream: str) -> str:
    # Probes off: the tests count requests, slots and tokens, and a synthetic request would be one more.
    return f"""
backends:
  {BACKEND}:
    dialect: llamacpp
    url: {upstream}/v1
    model: {SERVED_MODEL}
    pricing:
      gpu_hours: {{usd_per_hour: 1.20, accounting: amortized, assumed_tokens_per_s: 20}}
    max_concurrency: {SLOTS}
    context_window: {CONTEXT_PER_SLOT}
    timeouts: {{first_byte_s: 120, idle_s: 60}}
    signals:
      metrics_url: {upstream}/metrics
      slots_url: {upstream}/slots
      health_url: {upstream}/health
      interval_s: 0.25
routes:
  {ROUTE}:
    backends: [{BACKEND}]
    fallback: {{max_attempts: 1}}
tuning:
  probes: {{enabled: false}}
"""


@pytest.fixture(scope="session")
def real_gateway(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("real-policy") / "policy.yaml"
    path.write_text(policy_yaml(llama_server.url))
    with running_gateway(path) as gateway:
        yield gateway
