"""`gateway demo --real`: a real model (Gemma 3 270M on llama.cpp's llama-server) answers through the
gateway, which scrapes the server's /slots, /metrics and /health as the demo policy says."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.real.conftest import SETUP_COMMAND, missing_setup
from tests.servers import ProcessServer, free_port, python_module, wait_http


@pytest.mark.slow
def test_demo_real_serves_a_real_model(tmp_path: Path) -> None:
    reason = missing_setup()
    if reason is not None:
        pytest.skip(f"{reason}: run `{SETUP_COMMAND}`")
    port = free_port()
    log = tmp_path / "demo.log"
    demo = ProcessServer(
        python_module("gateway", "demo", "--real", "--port", str(port), "--time-scale", "0.02"),
        log_path=str(log),
    ).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=180)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="anything", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="gemma", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12
        )
        assert raw.headers["x-gateway-backend"] == "gemma-local"
        answer = raw.parse()
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens > 0
        deadline = time.monotonic() + 60
        while True:
            backend = httpx.get(f"http://127.0.0.1:{port}/admin/backends", timeout=10).json()["backends"]
            signals, scrape = backend["gemma-local"]["signals"], backend["gemma-local"]["scrape"]
            if signals is not None and scrape["healthy"] and signals["generation_tokens_total"]:
                break
            assert time.monotonic() < deadline, backend["gemma-local"]
            time.sleep(0.1)
        # One slot, as the demo starts it and its policy's max_concurrency says.
        assert signals["slots_total"] == 1 and scrape["last_error"] is None
    finally:
        assert demo.stop(timeout=20) == 0
    assert "real llama.cpp" in log.read_text()
