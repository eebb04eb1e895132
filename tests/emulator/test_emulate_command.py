"""`gateway emulate` as a process: vLLM refuses connections while it loads, then answers; --engine-args
replaces the recipe's flags (here: no --enable-prompt-tokens-details, so no cached-token details)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.servers import ProcessServer, free_port, python_module, wait_http


def wait_bound(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing bound port {port}")


def test_a_cold_booting_vllm_emulator_refuses_then_answers_without_cached_token_details() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--profile", "b300-vllm", "--port", str(port), "--time-scale", "0.005", "--cold-boot"]
    process = ProcessServer(python_module("gateway", "emulate", *args, "--engine-args", "")).start()
    try:
        wait_bound(port)  # the process holds the port, bound and not listening, as vLLM does while it loads
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        wait_http(url + "/health", timeout=60)  # 27 min at 0.005: ~8 s
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
        assert usage["prompt_tokens_details"] is None
    finally:
        process.stop()
