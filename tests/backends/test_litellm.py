"""``dialect: litellm`` backends, against the ``anthropic`` emulator profile (the Messages API, reached
through litellm's anthropic provider): streaming and whole answers with thinking billed once, fallback
to and from a vLLM pool by status, each attempt billed at its own backend's prices."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.emulator import create_emulator_app
from tests.conftest import TIME_SCALE, Gateway, Upstreams, running_gateway, wait_for_start_up_probes
from tests.doors.ledger import ANSWER, THINKING, ledger_row, settled_request_id
from tests.servers import ThreadedServer, threaded_server

KEY = "anthropic-backend-secret"
HELLO = [{"role": "user", "content": "Hello there, gateway."}]
PROMPT_TOKENS = 6  # the emulators count ceil(21 characters / 4)
IN_PRICE, OUT_PRICE = 3.0, 15.0  # USD per million tokens


@pytest.fixture(scope="module")
def claude(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[ThreadedServer]:
    monkeypatch_module.setenv("EMULATOR_API_KEY", KEY)
    app = create_emulator_app("anthropic-api", time_scale=TIME_SCALE)
    monkeypatch_module.delenv("EMULATOR_API_KEY")
    with threaded_server(app) as server:
        yield server


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def policy(up: Upstreams, claude: ThreadedServer) -> str:
    return f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {up.vllm.url}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
  claude:
    dialect: litellm
    url: {claude.url}
    model: anthropic/claude-emulated-4
    api_key_env: TEST_ANTHROPIC_KEY
    thinking: mandatory
    pricing: {{per_token: {{input_usd_per_mtok: {IN_PRICE}, output_usd_per_mtok: {OUT_PRICE}}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
routes:
  pool-then-claude:
    backends: [b300-vllm, claude]
    exploration: 0
  claude-only:
    backends: [claude]
"""


@pytest.fixture
def gateway(
    upstreams: Upstreams, claude: ThreadedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Gateway]:
    upstreams.reset()
    for server in (claude,):
        httpx.delete(server.url + "/emulator/faults")
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy(upstreams, claude))
    with running_gateway(path) as gateway:
        # claude's probe can answer before the pool's on a loaded machine: the pool test's first
        # request would then go to claude.
        wait_for_start_up_probes(gateway)
        yield gateway
    upstreams.reset()
    httpx.delete(claude.url + "/emulator/faults")


def chat(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def claude_cost(prompt: int, completion: int) -> float:
    return (prompt * IN_PRICE + completion * OUT_PRICE) / 1e6


@pytest.mark.parametrize("stream", [False, True])
def test_a_litellm_backend_answers_with_thinking_billed_once(gateway: Gateway, stream: bool) -> None:
    sdk = chat(gateway)
    if stream:
        chunks = list(sdk.chat.completions.create(model="claude-only", messages=HELLO, stream=True))  # type: ignore[arg-type]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        text = "".join(d.content or "" for d in deltas)
        thinking = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    else:
        answer = sdk.chat.completions.create(model="claude-only", messages=HELLO)  # type: ignore[arg-type]
        text = answer.choices[0].message.content or ""
        thinking = getattr(answer.choices[0].message, "reasoning_content", "")
    assert (thinking, text) == (THINKING, ANSWER)
    row = ledger_row(gateway, settled_request_id(gateway, 1))
    assert (row["backend"], row["status"], row["usage_source"]) == ("claude", "ok", "reported")
    assert (row["prompt_tokens"], row["completion_tokens"], row["reasoning_tokens"]) == (
        PROMPT_TOKENS,
        96,
        64,
    )
    assert row["cost_usd"] == pytest.approx(claude_cost(PROMPT_TOKENS, 96))


@pytest.mark.parametrize("stream", [False, True])
def test_a_503_from_the_pool_falls_back_to_the_litellm_backend(
    gateway: Gateway, upstreams: Upstreams, stream: bool
) -> None:
    sdk = chat(gateway)
    first = sdk.chat.completions.with_raw_response.create(model="pool-then-claude", messages=HELLO)  # type: ignore[arg-type]
    assert first.headers["x-gateway-backend"] == "b300-vllm"
    pool_row = ledger_row(gateway, first.headers["x-request-id"])
    assert pool_row["cost_basis"].startswith("gpu_hours") and pool_row["cost_usd"] > 0
    httpx.post(upstreams.vllm.url + "/emulator/faults", json={"error_rate": 1.0, "error_status": 503})
    if stream:
        chunks = list(sdk.chat.completions.create(model="pool-then-claude", messages=HELLO, stream=True))  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    else:
        answer = sdk.chat.completions.create(model="pool-then-claude", messages=HELLO)  # type: ignore[arg-type]
        assert answer.choices[0].message.content == ANSWER
    row = ledger_row(gateway, settled_request_id(gateway, 2))
    assert (row["backend"], row["attempts"], row["status"]) == ("claude", 2, "ok")
    # The failed pool attempt produced no tokens; the answer is billed at Claude's per-token prices.
    assert row["cost_usd"] == pytest.approx(claude_cost(row["prompt_tokens"], row["completion_tokens"]))
    assert row["cost_usd"] != pytest.approx(pool_row["cost_usd"])


def test_litellm_status_errors_map_to_fallback_or_to_the_client(
    gateway: Gateway, claude: ThreadedServer
) -> None:
    httpx.post(claude.url + "/emulator/faults", json={"error_rate": 1.0, "error_status": 400})
    with pytest.raises(openai.BadRequestError):  # the request's own fault: passed on, not retried
        chat(gateway).chat.completions.create(model="claude-only", messages=HELLO)  # type: ignore[arg-type]
    httpx.post(claude.url + "/emulator/faults", json={"error_rate": 1.0, "error_status": 529})
    with pytest.raises(openai.APIStatusError) as failed:
        chat(gateway).chat.completions.create(model="claude-only", messages=HELLO)  # type: ignore[arg-type]
    assert failed.value.status_code == 502  # every backend failed (the only one, overloaded)


def test_the_anthropic_sdk_reaches_a_litellm_backend_through_the_messages_door(gateway: Gateway) -> None:
    import anthropic

    sdk = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    with sdk.messages.stream(model="claude-only", max_tokens=1000, messages=HELLO) as stream:  # type: ignore[arg-type]
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == ANSWER  # type: ignore[union-attr]
    assert message.usage.output_tokens == 96


def test_a_missing_litellm_is_a_one_line_error(tmp_path: Path) -> None:
    """``gateway check`` on a litellm policy without litellm importable: one line, no traceback."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "litellm.py").write_text("raise ImportError('litellm is not installed here')\n")
    policy_file = Path(__file__).parents[2] / "policies" / "examples" / "api-only.yaml"
    env = {"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(policy_file)], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    assert "pip install 'litellm==1.110.2'" in done.stderr + done.stdout
