"""A real upstream: llama-cpp-python's OpenAI server running Gemma 3 270M on the CPU, and a gateway
routing to it. `bash tests/real/setup_llamacpp.sh` installs both; until it has run these tests skip."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Gateway, running_gateway
from tests.servers import ProcessServer, free_port, python_module, wait_http

CACHE = Path(os.environ.get("GATEWAY_CACHE") or Path.home() / ".cache" / "gateway")
MODEL_FILE = CACHE / "models" / "gemma3-270m-q4_k_m.gguf"
SERVED_MODEL = "gemma-3-270m-q4_k_m"
BACKEND = "gemma-llamacpp"
ROUTE = "gemma"
SETUP_COMMAND = "bash tests/real/setup_llamacpp.sh"
BOOT_TIMEOUT_S = 120.0


@dataclass
class LlamaCppServer:
    url: str
    log_path: Path


def missing_setup() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed in this environment"
    if not MODEL_FILE.is_file():
        return f"the Gemma 3 270M GGUF is missing at {MODEL_FILE}"
    return None


def wait_for_boot(server: ProcessServer, url: str, log_path: Path) -> None:
    """Until the server answers; fails at once, with its log, if the process dies first."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while True:
        assert server.proc is not None
        if server.proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited ({server.proc.returncode}):\n{log_tail(log_path)}")
        try:
            wait_http(url, timeout=1.0)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server did not answer {url}:\n{log_tail(log_path)}") from None


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@pytest.fixture(scope="session")
def llamacpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    reason = missing_setup()
    if reason is not None:
        pytest.skip(f"{reason}: run `{SETUP_COMMAND}` to build and fetch the real llama.cpp upstream")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("llamacpp") / "server.log"
    args = python_module(
        "llama_cpp.server",
        *("--model", str(MODEL_FILE)),
        *("--model_alias", SERVED_MODEL),
        *("--chat_format", "gemma"),
        *("--host", "127.0.0.1"),
        *("--port", str(port)),
        *("--n_ctx", "2048"),
        # Two cores on the CI box; more threads than cores only makes decode slower.
        *("--n_threads", "2"),
    )
    server = ProcessServer(args, log_path=str(log_path)).start()
    try:
        # llama_cpp.server has no /health: /v1/models answers once the model is loaded.
        wait_for_boot(server, f"{url}/v1/models", log_path)
        yield LlamaCppServer(url, log_path)
    finally:
        server.stop()


def policy_yaml(upstream: str) -> str:
    # llama_cpp.server (the Python one, unlike llama-server) has no /health, /metrics or /slots, so no
    # signals: the gateway's reachability probe falls back to /v1/models. It runs one request at a time.
    return f"""
backends:
  {BACKEND}:
    dialect: llamacpp
    url: {upstream}/v1
    model: {SERVED_MODEL}
    pricing:
      gpu_hours: {{usd_per_hour: 1.20, accounting: amortized, assumed_tokens_per_s: 20}}
    max_concurrency: 1
    context_window: 2048
    timeouts: {{first_byte_s: 120, idle_s: 60}}
routes:
  {ROUTE}:
    backends: [{BACKEND}]
    fallback: {{max_attempts: 1}}
"""


@pytest.fixture(scope="session")
def real_gateway(
    llamacpp_server: LlamaCppServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("real-policy") / "policy.yaml"
    path.write_text(policy_yaml(llamacpp_server.url))
    with running_gateway(path) as gateway:
        yield gateway
