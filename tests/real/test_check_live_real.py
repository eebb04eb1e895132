"""`gateway check --live` against the real llama-server: its signals found under their real names, its
health read as llama.cpp's, cached tokens reported, llama-server's continue_final_message accepted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.real.conftest import LlamaServer, policy_yaml
from tests.servers import python_module

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_check_live_reads_the_real_llama_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(llama_server.url))
    done = subprocess.run(
        python_module("gateway", "check", "--live", str(policy)),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        cwd=ROOT,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for name in (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
    ):
        assert name in out, out
    assert "/slots" in out and "HTTP 200" in out and "healthy" in out
    assert "UNUSABLE" not in out
    row = next(line for line in out.splitlines() if line.startswith("│ gemma-llamacpp"))
    assert "on" in row.split("│")[6], row  # cached tokens: llama-server always reports them
    assert "accepted" in out  # continue_final_message
