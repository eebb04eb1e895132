"""A prompt past an engine's context reaches the client as OpenAI's ``context_length_exceeded``, whatever
the engine calls it (docs/contracts/*.yaml, limits.context_length: none of vLLM, SGLang, llama-server sends
that code, and SGLang's error body is not even nested under "error")."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.emulator import PROFILES, create_emulator_app
from tests.conftest import running_gateway
from tests.servers import threaded_server


@pytest.mark.parametrize("profile", ["b300-vllm", "h200-sglang", "a100-llamacpp"])
def test_a_prompt_past_the_context_is_context_length_exceeded(profile: str, tmp_path: Path) -> None:
    small = PROFILES[profile].with_overrides({"context_tokens": 256})
    with threaded_server(create_emulator_app(small, time_scale=0.001)) as upstream:
        path = tmp_path / "policy.yaml"
        path.write_text(f"""
backends:
  pool:
    dialect: {small.dialect}
    url: {upstream.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 60, accounting: marginal}}}}
routes:
  kimi-k3:
    backends: [pool]
""")
        with running_gateway(path) as gateway:
            body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "lorem " * 2000}]}
            reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded", error
    assert "context" in error["message"] and "{" not in error["message"], error
