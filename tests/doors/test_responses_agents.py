"""What coding agents send the Responses door: Codex CLI's recorded requests (tests/clients/fixtures),
namespace and custom tools and their calls going back in the client's shape, hosted tools never
offered as functions, and reasoning sealed into ``encrypted_content`` and opened when it comes back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.doors.reasoning_seal import KEY_ENV, Keyring, ensure_key
from gateway.doors.responses import RESPONSES, chat_payload
from gateway.doors.responses_answer import ResponsesState
from tests.conftest import Gateway, Upstreams
from tests.doors.ledger import ANSWER, THINKING

FIXTURES = Path(__file__).resolve().parents[1] / "clients" / "fixtures"
TEST_SECRET = "a test key of thirty-two characters or more"
FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
NAMESPACE = {
    "type": "namespace",
    "name": "collaboration",
    "description": "agents",
    "tools": [
        {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}},
        {"type": "function", "name": "wait", "parameters": {"type": "object", "properties": {}}},
    ],
}
CUSTOM = {
    "type": "custom",
    "name": "exec",
    "description": "Run JavaScript.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
# Every hosted (server-side) tool type of the Responses API: none is run by a chat backend.
HOSTED = [
    {"type": "web_search", "external_web_access": False},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "computer_use_preview", "display_width": 800, "display_height": 600, "environment": "linux"},
    {"type": "mcp", "server_label": "docs", "server_url": "https://example.invalid/mcp"},
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "apply_patch"},
    {"type": "tool_search"},
]


def recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())["body"]
    return body


def post(gateway: Gateway, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.base_url + "/responses", json={"model": "vllm-only", **body}, timeout=30)


def streamed(gateway: Gateway, body: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any]]:
    """The stream's response and its response.completed event's Response."""
    reply = post(gateway, {**body, "stream": True})
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.completed", events[-1]
    return reply, events[-1]["response"]


def upstream_body(upstreams: Upstreams) -> dict[str, Any]:
    """The last chat request the vLLM emulator received."""
    requests = httpx.get(upstreams.vllm.url + "/emulator/requests").json()
    body: dict[str, Any] = [r["body"] for r in requests if r["path"].endswith("/chat/completions")][-1]
    return body


def upstream_messages(upstreams: Upstreams) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = upstream_body(upstreams)["messages"]
    return messages


@pytest.fixture(autouse=True)
def reasoning_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, TEST_SECRET)


# -- Codex's recorded requests, translated -----------------------------------------------------------


def test_codex_request_for_a_route_becomes_a_chat_request() -> None:
    state = ResponsesState()
    payload = chat_payload(recorded("codex-0.171.0-kimi-k3.json"), state)
    names = [t["function"]["name"] for t in payload["tools"]]
    assert names[0] == "exec_command" and "spawn_agent" in names  # multi_agent_v1's, unpacked
    assert state.tools.offered("spawn_agent").namespace == "multi_agent_v1"
    assert all(t["type"] == "function" for t in payload["tools"])
    assert state.notes == ["hosted tools not run by this gateway's backends were left out: web_search"]
    assert [m["role"] for m in payload["messages"][:3]] == ["system", "system", "user"]  # developer -> system
    assert payload["parallel_tool_calls"] is True and payload["stream"] is True
    assert "prompt_cache_key" not in payload and "client_metadata" not in payload and "include" not in payload
    assert state.cache_key == "01a23c16-d788-7630-8d7d-566d1d111387"


def test_codex_default_model_request_offers_its_additional_tools() -> None:
    state = ResponsesState()
    payload = chat_payload(recorded("codex-0.171.0-default-model.json"), state)
    names = [t["function"]["name"] for t in payload["tools"]]
    assert {"exec", "wait", "sleep", "spawn_agent", "list_agents"} <= set(names)
    exec_tool = next(t["function"] for t in payload["tools"] if t["function"]["name"] == "exec")
    assert exec_tool["parameters"]["required"] == ["input"] and "lark grammar" in exec_tool["description"]
    assert state.tools.offered("exec").custom and state.tools.offered("exec").namespace == "functions"
    assert any(note.endswith("grammar shown but not enforced: exec") for note in state.notes)
    assert "reasoning_effort" in payload and payload["reasoning_effort"] == "low"
    assert all(m["role"] != "additional_tools" for m in payload["messages"])


def test_prompt_cache_key_is_kept_on_the_parsed_request(gateway: Gateway) -> None:
    body = {"model": "vllm-only", "input": "hi", "prompt_cache_key": "session-1"}
    parsed = RESPONSES.parse(json.dumps(body).encode(), gateway.runtime.policy, 4.0)
    assert parsed.cache_key == "session-1" and "prompt_cache_key" not in parsed.payload


def test_a_recorded_codex_request_is_answered_with_a_call_to_its_shell_tool(gateway: Gateway) -> None:
    body = recorded("codex-0.171.0-kimi-k3.json")
    reply, response = streamed(gateway, body)
    assert reply.status_code == 200
    assert "web_search" in reply.headers["x-gateway-notes"]
    reasoning, call = response["output"]
    assert call["type"] == "function_call" and call["name"] == "exec_command" and "namespace" not in call
    assert json.loads(call["arguments"]) == {"cmd": ANSWER}
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith("gw2:")


# -- namespaces and custom tools: the model's calls go back as the client offered the tools ----------


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespaced_call_goes_back_with_its_namespace(gateway: Gateway, stream: bool) -> None:
    body = {"input": "spawn one", "tools": [NAMESPACE, FUNCTION]}
    response = streamed(gateway, body)[1] if stream else post(gateway, body).json()
    call = response["output"][-1]
    assert (call["type"], call["namespace"], call["name"]) == (
        "function_call",
        "collaboration",
        "spawn_agent",
    )
    follow_up = [
        {"role": "user", "content": "spawn one"},
        {**{k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")}},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "spawned"},
    ]
    second = post(gateway, {"input": follow_up, "tools": [NAMESPACE, FUNCTION]})
    assert second.status_code == 200 and second.json()["output"][-1]["type"] == "message"


def test_names_two_namespaces_share_stay_apart(gateway: Gateway) -> None:
    other = {**NAMESPACE, "name": "clock", "tools": [NAMESPACE["tools"][1]]}  # type: ignore[index]
    state = ResponsesState()
    payload = chat_payload({"model": "m", "input": "x", "tools": [NAMESPACE, other]}, state)
    assert [t["function"]["name"] for t in payload["tools"]] == [
        "spawn_agent",
        "collaboration__wait",
        "clock__wait",
    ]
    assert state.tools.offered("clock__wait").namespace == "clock"


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_call_goes_back_as_free_text(gateway: Gateway, stream: bool) -> None:
    body = {"input": "run it", "tools": [CUSTOM]}
    response = streamed(gateway, body)[1] if stream else post(gateway, body).json()
    call = response["output"][-1]
    assert (call["type"], call["name"], call["input"]) == ("custom_tool_call", "exec", ANSWER)
    follow_up = [
        {"role": "user", "content": "run it"},
        {"type": "custom_tool_call", "call_id": call["call_id"], "name": "exec", "input": call["input"]},
        {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "done"},
    ]
    second = post(gateway, {"input": follow_up, "tools": [CUSTOM]})
    assert second.status_code == 200 and second.json()["status"] == "completed"


# -- hosted tools are never faked as functions --------------------------------------------------------


@pytest.mark.parametrize("hosted", HOSTED, ids=[str(t["type"]) for t in HOSTED])
def test_a_hosted_tool_is_left_out_with_a_note(
    gateway: Gateway, upstreams: Upstreams, hosted: dict[str, Any]
) -> None:
    alone = post(gateway, {"input": "search", "tools": [hosted]})
    assert alone.status_code == 200, alone.text
    assert hosted["type"] in alone.headers["x-gateway-notes"]
    assert [item["type"] for item in alone.json()["output"]] == ["reasoning", "message"]  # no call at all
    assert "tools" not in upstream_body(upstreams)
    beside = post(gateway, {"input": "search", "tools": [hosted, FUNCTION]}).json()
    assert [item.get("name") for item in beside["output"] if "call" in item["type"]] == ["lookup"]


def test_forcing_a_hosted_tool_is_refused_in_openai_shape(gateway: Gateway) -> None:
    reply = post(gateway, {"input": "search", "tools": [HOSTED[0]], "tool_choice": {"type": "web_search"}})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "tool_choice"


# -- reasoning round trip -----------------------------------------------------------------------------


def test_sealed_reasoning_comes_back_to_the_model(gateway: Gateway, upstreams: Upstreams) -> None:
    include = ["reasoning.encrypted_content"]
    first = post(gateway, {"input": "think", "include": include, "store": False}).json()
    reasoning, message = first["output"]
    assert reasoning["encrypted_content"] and THINKING not in reasoning["encrypted_content"]
    history = [
        {"role": "user", "content": "think"},
        {"type": "reasoning", "summary": [], "encrypted_content": reasoning["encrypted_content"]},
        {"type": "message", "role": "assistant", "content": message["content"]},
        {"role": "user", "content": "again"},
    ]
    second = post(gateway, {"input": history, "include": include, "store": False})
    assert second.status_code == 200 and "x-gateway-notes" not in second.headers
    assistant = [m for m in upstream_messages(upstreams) if m["role"] == "assistant"]
    assert assistant == [{"role": "assistant", "content": ANSWER, "reasoning_content": THINKING}]


@pytest.mark.parametrize(
    "blob",
    ["tampered", "gAAAAABopenai-style-opaque-blob", "gw1:AAAA", "gw2:AAAA", "gw2:!!", "gw2:" + "A" * 60],
)
def test_reasoning_this_gateway_cannot_open_is_left_out_with_a_note(
    gateway: Gateway, upstreams: Upstreams, blob: str
) -> None:
    if blob == "tampered":
        sealed = Keyring(TEST_SECRET).for_caller("").seal("secret thoughts")
        blob = sealed[:-6] + ("AAAAAA" if not sealed.endswith("AAAAAA") else "BBBBBB")
    history = [
        {"role": "user", "content": "think"},
        {"type": "reasoning", "summary": [], "encrypted_content": blob},
        {"type": "message", "role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    reply = post(gateway, {"input": history})
    assert reply.status_code == 200
    assert "reasoning item(s) not sealed by this gateway" in reply.headers["x-gateway-notes"]
    assert all("reasoning_content" not in m for m in upstream_messages(upstreams))


def test_another_secret_cannot_open_a_blob() -> None:
    blob = Keyring("one secret of thirty-two characters...").for_caller("").seal("thoughts")
    assert Keyring("one secret of thirty-two characters...").for_caller("").open(blob) == "thoughts"
    assert Keyring("another secret of thirty-two characters").for_caller("").open(blob) is None


def test_reasoning_is_sealed_only_when_asked(gateway: Gateway) -> None:
    reasoning = post(gateway, {"input": "think"}).json()["output"][0]
    assert reasoning["type"] == "reasoning" and "encrypted_content" not in reasoning


def test_a_forced_namespaced_function_is_forced_by_its_chat_name(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    choice = {"type": "function", "namespace": "collaboration", "name": "wait"}
    reply = post(gateway, {"input": "wait", "tools": [FUNCTION, NAMESPACE], "tool_choice": choice})
    assert reply.status_code == 200
    assert upstream_body(upstreams)["tool_choice"] == {"type": "function", "function": {"name": "wait"}}
    nameless = post(gateway, {"input": "wait", "tools": [FUNCTION], "tool_choice": {"type": "function"}})
    assert nameless.status_code == 400 and nameless.json()["error"]["param"] == "tool_choice"


def test_serve_makes_a_key_only_when_the_operator_set_none() -> None:
    given = {KEY_ENV: "the fleet's key, thirty-two characters long"}
    assert ensure_key(given) is None
    assert given == {KEY_ENV: "the fleet's key, thirty-two characters long"}
    empty: dict[str, str] = {}
    ensure_key(empty)
    made = empty[KEY_ENV]
    assert (
        len(made) >= 32 and Keyring(made).for_caller("").open(Keyring(made).for_caller("").seal("x")) == "x"
    )
