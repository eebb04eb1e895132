"""An answer cut on one pool continues on the real ``llama-server``, as ``content`` (issue 27, defect 5).

llama-server continues a final assistant message with ``continue_final_message`` and
``add_generation_prompt: false`` (both true together are a 400), and with a Jinja chat template (its
default) renders the message's content as the start of the answer, not as a finished turn. The Gemma
GGUF carries no template, so this server is given a Gemma Jinja template of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.demo import real_server_binary, real_server_command
from gateway.emulator import create_emulator_app
from tests.conftest import TIME_SCALE, Gateway, running_gateway
from tests.real.conftest import MODEL_FILE, SERVED_MODEL, skip_without_setup, wait_for_boot
from tests.servers import ProcessServer, free_port, threaded_server
from tests.test_resume import HELLO, numbered, set_faults, settled, sse_events, stream_text

pytestmark = pytest.mark.slow

GEMMA_JINJA = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MAX_TOKENS = 24  # small answers: the server decodes on shared CPU cores


@pytest.fixture(scope="module")
def jinja_llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    skip_without_setup()
    binary = real_server_binary()
    assert binary is not None
    folder = tmp_path_factory.mktemp("llama-jinja")
    template = folder / "gemma.jinja"
    template.write_text(GEMMA_JINJA)
    port = free_port()
    command = real_server_command(binary, MODEL_FILE, SERVED_MODEL, port, slots=1, threads=1)
    command = [part for part in command if part != "--no-jinja"]
    at = command.index("--chat-template")
    command[at : at + 2] = ["--jinja", "--chat-template-file", str(template)]
    log_path = folder / "server.log"
    process = ProcessServer(command, log_path=str(log_path)).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_boot(process, url, log_path)
        yield url
    finally:
        process.stop()


def direct(url: str, body: dict[str, Any]) -> httpx.Response:
    body = {"model": SERVED_MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, **body}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_llama_server_continues_a_final_assistant_message_as_content(jinja_llama_server: str) -> None:
    prefix = "The sea is"
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    messages.append({"role": "assistant", "content": prefix})
    refused = direct(jinja_llama_server, {"messages": messages, "continue_final_message": True})
    assert refused.status_code == 400 and "add_generation_prompt" in refused.text
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    events = sse_events(direct(jinja_llama_server, {**body, "stream": True}).text)
    assert events[-1] == "[DONE]"
    continued = stream_text(events, "content")
    assert continued.strip(), "the answer went on, as content"
    assert not continued.startswith(prefix), "the prefill is not echoed"
    assert not stream_text(events, "reasoning_content")


@pytest.fixture
def cut_then_llama(jinja_llama_server: str, tmp_path: Path) -> Iterator[tuple[Gateway, str]]:
    with threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE, seed=31)) as pool:
        path = tmp_path / "policy.yaml"
        path.write_text(f"""
backends:
  cut-pool:
    dialect: vllm
    url: {pool.url}/v1
    model: {SERVED_MODEL}
    family: gemma
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
  gemma-llamacpp:
    dialect: llamacpp
    url: {jinja_llama_server}/v1
    model: {SERVED_MODEL}
    family: gemma
    pricing: {{gpu_hours: {{usd_per_hour: 1.20, accounting: marginal, assumed_tokens_per_s: 20}}}}
    timeouts: {{first_byte_s: 120, idle_s: 60}}
routes:
  gemma:
    backends: [cut-pool, gemma-llamacpp]
    exploration: 0
tuning: {{probes: {{enabled: false}}}}
""")
        with running_gateway(path) as gateway:
            yield gateway, pool.url


def test_an_answer_cut_elsewhere_continues_on_the_real_llama_server_as_content(
    cut_then_llama: tuple[Gateway, str],
) -> None:
    gateway, pool = cut_then_llama
    # The emulated pool sends its role chunk and word0..word4, then its connection drops.
    set_faults(pool, reasoning_tokens=0, content_tokens=40, drop_after_chunks=6)
    body = {"model": "gemma", "messages": HELLO, "stream": True, "max_tokens": MAX_TOKENS}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=180)
    assert response.status_code == 200 and response.headers["x-gateway-backend"] == "cut-pool"
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
    content = stream_text(events, "content")
    assert content.startswith(numbered("word", 5)) and content[len(numbered("word", 5)) :].strip(), content
    assert not stream_text(events, "reasoning_content") and not stream_text(events, "reasoning")
    attempts = settled(gateway).attempts
    assert [(a.backend, a.status, a.resumed) for a in attempts] == [
        ("cut-pool", "dropped", None),
        ("gemma-llamacpp", "ok", "continued"),
    ]
