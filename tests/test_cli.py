"""The commands a user types: `gateway demo` serves from nothing, `gateway check` judges policies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai

from tests.servers import ProcessServer, free_port, python_module, wait_http

REPO = Path(__file__).resolve().parent.parent


def test_demo_serves_the_default_policy_and_stops_its_emulators(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "demo.log"
    demo = ProcessServer(
        python_module("gateway", "demo", "--port", str(port), "--time-scale", "0.02"), log_path=str(log)
    ).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", timeout=60)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="anything", max_retries=0)
        answer = client.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}])
        assert answer.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="kimi-k3", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
        )
        assert any(c.choices and c.choices[0].delta.content for c in chunks)
    finally:
        assert demo.stop() == 0
    printed = log.read_text()
    assert f"http://127.0.0.1:{port}/v1" in printed and "from openai import OpenAI" in printed
    for emulator_port in (8101, 8102, 8103):  # the demo's children went with it
        try:
            httpx.get(f"http://127.0.0.1:{emulator_port}/health", timeout=1)
        except httpx.ConnectError:
            continue
        raise AssertionError(f"emulator on :{emulator_port} still running after the demo stopped")


def test_check_prints_routes_for_a_valid_policy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(REPO / "policies" / "default.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "route kimi-k3" in result.stdout and "b300-vllm" in result.stdout


def test_check_names_file_line_and_path_for_an_invalid_policy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (REPO / "policies" / "default.yaml").read_text()
    bad.write_text(text.replace("ttft_p95_ms: 3000", "ttft_p95_ms: -3"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    line = next(i for i, row in enumerate(bad.read_text().splitlines(), 1) if "ttft_p95_ms: -3" in row)
    assert f"{bad}:{line}:" in result.stdout and "routes.kimi-k3.slo.ttft_p95_ms" in result.stdout


def test_serve_refuses_a_bad_policy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: {}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2 and "bad.yaml" in result.stderr
