"""`gateway demo --real`: a real model (Gemma 3 270M on llama.cpp) answers through the gateway."""

from __future__ import annotations

from pathlib import Path

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
    finally:
        assert demo.stop(timeout=20) == 0
    assert "real llama.cpp" in log.read_text()
