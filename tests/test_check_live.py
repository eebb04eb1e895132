"""`gateway check --live POLICY` against running emulators: the table, and the exit status when a backend
a route needs cannot take a request."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import PAID_KEY, Upstreams
from tests.servers import free_port, python_module

ROOT = Path(__file__).resolve().parents[1]


def check_live(policy: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *python_module("gateway", "check", "--live", str(policy)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, **(env or {})},
        cwd=ROOT,
    )


def test_the_default_policy_against_the_demo_emulators_prints_the_table(
    upstreams: Upstreams, tmp_path: Path
) -> None:
    text = (ROOT / "policies" / "default.yaml").read_text()
    for port, server in (("8101", upstreams.vllm), ("8102", upstreams.llamacpp), ("8103", upstreams.paid)):
        text = text.replace(f"http://127.0.0.1:{port}", server.url)
    policy = tmp_path / "default.yaml"
    policy.write_text(text)
    done = check_live(policy, {"PAID_API_KEY": PAID_KEY})
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "gateway check --live" in out
    for backend in ("b300-vllm", "a100-llamacpp", "paid-api"):
        assert backend in out
    assert "vllm:num_requests_running" in out and "llamacpp:requests_processing" in out and "/slots" in out
    assert "HTTP 200" in out and "listed" in out and "UNUSABLE" not in out
    assert "accepted, as content" in out  # vLLM's continue_final_message and the paid API's partial mode


def test_a_dead_backend_and_one_without_metrics_are_named_and_the_exit_status_is_1(
    upstreams: Upstreams, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"""
backends:
  dead-llamacpp:
    dialect: llamacpp
    url: {dead}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 20, accounting: marginal}}}}
    signals: {{metrics_url: {dead}/metrics, health_url: {dead}/health}}
  vllm-without-metrics:
    dialect: vllm
    url: {upstreams.vllm.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 60, accounting: marginal}}}}
routes:
  kimi-k3:
    backends: [vllm-without-metrics, dead-llamacpp]
""")
    done = check_live(policy)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "dead-llamacpp: UNUSABLE: cannot connect" in out
    assert "unusable backends a route needs: dead-llamacpp" in out
    assert "vllm-without-metrics: routing is blind to running requests; queue depth" in out
    assert "vllm-without-metrics: UNUSABLE" not in out


PROFILE_MODELS = {
    "b300-vllm": ("vllm", "moonshotai/Kimi-K3"),
    "h200-sglang": ("sglang", "moonshotai/Kimi-K3"),
    "a100-llamacpp": ("llamacpp", "Kimi-K3-UD-IQ1_S"),
    "paid-api": ("openai", "kimi-k3"),
}


def test_continuation_is_reported_as_each_engine_answers_the_gateways_own_request() -> None:
    """The probe asks as a resume does (the thinking so far, streamed): vLLM and llama-server render the
    thinking as closed and go on as content; SGLang's parser, without the think-end marker in the prefix,
    goes on as reasoning_content, which the gateway relays as content; the paid API's partial mode."""
    import asyncio
    import contextlib

    from gateway.emulator import create_emulator_app
    from gateway.measure.live import probe_policy
    from gateway.policy.load import compile_policy_text
    from tests.servers import threaded_server

    with contextlib.ExitStack() as stack:
        text = "backends:\n"
        for name, (dialect, model) in PROFILE_MODELS.items():
            url = stack.enter_context(threaded_server(create_emulator_app(name, time_scale=0.001))).url
            text += f"""  {name}:
    dialect: {dialect}
    url: {url}/v1
    model: {model}
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}}}
"""
        text += f"routes:\n  r:\n    backends: [{', '.join(PROFILE_MODELS)}]\n"
        reports = asyncio.run(probe_policy(compile_policy_text(text, "policy.yaml")))
    continuation = {report.name: report.continuation for report in reports}
    resume = "; policy resume: continue_final_message"
    assert continuation == {
        "b300-vllm": "accepted, as content" + resume,
        "h200-sglang": "accepted, as reasoning_content (relayed as content)" + resume,
        "a100-llamacpp": "accepted, as content" + resume,
        "paid-api": "accepted, as content; policy resume: none",
    }
