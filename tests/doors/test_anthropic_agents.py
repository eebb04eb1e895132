"""The Messages door with what coding agents send: Claude Code's recorded requests (system messages
inside ``messages``, adaptive thinking, effort, context management, deferred tools), hosted tools,
count_tokens and the error shape under /v1/messages*. Real gateway, real emulators: what reached the
upstream is read from the emulator's request log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.measure.probes import PROBE_PROMPT
from tests.conftest import Gateway, Upstreams
from tests.servers import ThreadedServer

FIXTURES = Path(__file__).parents[1] / "clients" / "fixtures"
CLIENT_TOOL = {
    "name": "lookup",
    "description": "Look something up",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}
# Every kind of tool Anthropic's servers run, as clients declare them.
HOSTED_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    {"type": "web_fetch_20250910", "name": "web_fetch"},
    {"type": "code_execution_20250825", "name": "code_execution"},
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
    {"type": "mcp_toolset", "name": "mcp", "mcp_server_name": "docs"},
]


def recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / f"claude_code_{name}.json").read_text())["body"]
    return body


def sent_upstream(server: ThreadedServer) -> list[dict[str, Any]]:
    """The completions this upstream received, the gateway's start-up probes left out."""
    entries = httpx.get(server.url + "/emulator/requests").json()
    bodies = [entry["body"] for entry in entries if entry["path"].endswith("/chat/completions")]
    return [body for body in bodies if body["messages"][-1].get("content") != PROBE_PROMPT]


def post(gateway: Gateway, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gateway.url + "/v1/messages", json=body, timeout=30)


def events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def tool_uses(response: httpx.Response) -> list[str]:
    if response.headers["content-type"].startswith("text/event-stream"):
        starts = [e["content_block"] for e in events(response) if e["type"] == "content_block_start"]
        return [block["name"] for block in starts if block["type"] == "tool_use"]
    return [block["name"] for block in response.json()["content"] if block["type"] == "tool_use"]


def test_claude_codes_first_request_streams_and_keeps_its_system_messages_in_place_on_vllm(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    body = {**recorded("first_turn"), "model": "vllm-only"}
    answer = post(gateway, body)
    assert answer.status_code == 200, answer.text
    assert [e["type"] for e in events(answer)][-2:] == ["message_delta", "message_stop"]
    (sent,) = sent_upstream(upstreams.vllm)
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "system"]  # Kimi's template takes a system turn anywhere
    assert not sent["messages"][0]["content"].startswith("x-anthropic-billing-header")
    assert sent["messages"][2]["content"].startswith("# Environment")
    assert sent["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True}  # adaptive
    assert sent["reasoning_effort"] == "high"  # output_config.effort
    offered = [tool["function"]["name"] for tool in sent["tools"]]
    assert "Bash" in offered and "DeferredToolPlaceholder" not in offered  # deferred: not yet searched
    assert "user" not in sent or isinstance(sent["user"], str)  # metadata: the privacy part's concern


def test_on_llamacpp_the_system_messages_join_the_leading_prompt_and_the_effort_is_noted(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    answer = post(gateway, {**recorded("first_turn"), "model": "llamacpp-only", "stream": False})
    assert answer.status_code == 200, answer.text
    (sent,) = sent_upstream(upstreams.llamacpp)
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]  # Gemma-style templates
    assert "# Environment" in sent["messages"][0]["content"]
    assert "reasoning_effort" not in sent
    assert "reasoning_effort dropped" in answer.headers["x-gateway-notes"]


def test_the_turn_after_a_tool_result_goes_through(gateway: Gateway, upstreams: Upstreams) -> None:
    answer = post(gateway, {**recorded("after_tool_result"), "model": "vllm-only"})
    assert answer.status_code == 200, answer.text
    (sent,) = sent_upstream(upstreams.vllm)
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system", "assistant", "tool"]
    assert tool_uses(answer) == []  # the emulator answers a tool result in words


@pytest.mark.parametrize("hosted", HOSTED_TOOLS, ids=lambda tool: tool["type"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_hosted_tool_is_never_offered_as_a_function(
    gateway: Gateway, upstreams: Upstreams, hosted: dict[str, Any], stream: bool
) -> None:
    """The emulator calls the first tool it is offered: a hosted tool first in the list would be the
    one "called" if it went upstream as a function."""
    messages = [{"role": "user", "content": "look it up"}]
    body = {"model": "vllm-only", "max_tokens": 200, "messages": messages, "stream": stream}
    answer = post(gateway, {**body, "tools": [hosted, CLIENT_TOOL]})
    assert answer.status_code == 200, answer.text
    assert tool_uses(answer) == ["lookup"]
    (sent,) = sent_upstream(upstreams.vllm)
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["lookup"]
    assert f"{hosted['name']} ({hosted['type']}) dropped" in answer.headers["x-gateway-notes"]


@pytest.mark.parametrize("hosted", HOSTED_TOOLS, ids=lambda tool: tool["type"])
def test_a_request_for_a_hosted_tool_alone_is_refused_in_anthropic_shape(
    gateway: Gateway, upstreams: Upstreams, hosted: dict[str, Any]
) -> None:
    """Claude Code's WebSearch asks for web_search and nothing else: answered without it, the model's
    words would come back as search results. Refused, the client tells its model why."""
    body = {"model": "vllm-only", "max_tokens": 200, "messages": [{"role": "user", "content": "q"}]}
    answer = post(gateway, {**body, "tools": [hosted]})
    assert answer.status_code == 400
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
    assert "server tool" in answer.json()["error"]["message"]
    forced = {**body, "tools": [hosted, CLIENT_TOOL], "tool_choice": {"type": "tool", "name": hosted["name"]}}
    assert post(gateway, forced).status_code == 400
    assert sent_upstream(upstreams.vllm) == []


@pytest.mark.parametrize(
    ("thinking", "effort", "expected_switch", "expected_effort"),
    [
        ({"type": "disabled"}, None, False, None),
        ({"type": "enabled", "budget_tokens": 2000}, None, True, "low"),
        ({"type": "enabled", "budget_tokens": 30000}, "medium", True, "medium"),
        ({"type": "adaptive"}, "max", True, "high"),  # vLLM takes low, medium or high
    ],
)
def test_thinking_and_effort_reach_vllm_as_its_template_switch_and_reasoning_effort(
    gateway: Gateway,
    upstreams: Upstreams,
    thinking: dict[str, Any],
    effort: str | None,
    expected_switch: bool,
    expected_effort: str | None,
) -> None:
    body: dict[str, Any] = {"model": "vllm-only", "max_tokens": 50, "thinking": thinking}
    body["messages"] = [{"role": "user", "content": "hi"}]
    if effort is not None:
        body["output_config"] = {"effort": effort}
    assert post(gateway, body).status_code == 200
    (sent,) = sent_upstream(upstreams.vllm)
    assert sent["chat_template_kwargs"]["thinking"] is expected_switch
    assert sent.get("reasoning_effort") == expected_effort


def test_context_management_and_cache_control_are_accepted(gateway: Gateway) -> None:
    content = [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    body = {"model": "vllm-only", "max_tokens": 50, "messages": [{"role": "user", "content": content}]}
    body["context_management"] = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    answer = post(gateway, body)
    assert answer.status_code == 200
    assert "clear_tool_uses_20250919 not applied" in answer.headers["x-gateway-notes"]


def test_count_tokens_answers_in_anthropic_shape(gateway: Gateway) -> None:
    body = recorded("first_turn")
    body.pop("max_tokens")
    body.pop("stream")
    answer = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["x-gateway-token-count"] == "estimate"
    tokens = answer.json()["input_tokens"]
    assert answer.json() == {"input_tokens": tokens} and 1_000 < tokens < 40_000
    missing = httpx.post(gateway.url + "/v1/messages/count_tokens", json={**body, "model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/v1/messages/batches", 404), ("GET", "/v1/messages/msg_1", 404), ("GET", "/v1/messages", 405)],
)
def test_every_error_under_v1_messages_is_in_anthropic_shape(
    gateway: Gateway, method: str, path: str, status: int
) -> None:
    answer = httpx.request(method, gateway.url + path, json={})
    assert answer.status_code == status
    assert answer.json()["type"] == "error" and set(answer.json()["error"]) == {"type", "message"}
    if status == 405:
        assert answer.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "odd",
    [
        {"output_config": {"effort": ["high"]}},
        {"output_config": {"effort": "extreme"}},
        {"thinking": {"type": "sometimes"}},
        {
            "tools": [{"type": "web_search_20250305", "name": ["x"]}, CLIENT_TOOL],
            "tool_choice": {"type": "tool", "name": ["x"]},
        },
        {"tools": [{**CLIENT_TOOL, "name": ["x"], "defer_loading": True}]},
        {"messages": [{"role": "system", "content": 7}]},
    ],
)
def test_odd_values_in_the_new_fields_are_the_clients_400_never_a_500(
    gateway: Gateway, odd: dict[str, Any]
) -> None:
    body = {"model": "vllm-only", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **odd}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        answer = httpx.post(gateway.url + path, json=body, timeout=30)
        assert answer.status_code in (200, 400), (path, answer.text)
        assert answer.status_code == 200 or answer.json()["error"]["type"] == "invalid_request_error"
