"""backends/chat_shape: system messages and reasoning knobs as each engine's chat template takes them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.backends.chat_shape import merged_system_messages, shaped
from gateway.policy.compiled import CompiledBackend
from gateway.policy.schema import Dialect, SystemMessages, Thinking
from tests.unit.factories import pool_backend


def backend(
    dialect: Dialect, *, thinking: Thinking = "optional", system_messages: SystemMessages | None = None
) -> CompiledBackend:
    return dataclasses.replace(
        pool_backend(thinking=thinking), dialect=dialect, system_messages=system_messages
    )


def sys(text: str, role: str = "system") -> dict[str, Any]:
    return {"role": role, "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# Claude Code's first request: its system prompt, the user's turn, then its agent and skill lists.
CLAUDE_CODE = [sys("You are Claude Code."), user("hello"), sys("# Environment"), sys("# Skills")]


def test_a_plain_conversation_goes_as_it_came() -> None:
    payload = {"messages": [sys("Be brief."), user("hi")], "max_tokens": 5}
    for dialect in ("vllm", "sglang", "llamacpp", "openai", "litellm"):
        assert shaped(payload, backend(dialect)) == (payload, ())
        assert shaped(payload, backend(dialect))[0] is payload  # no copy on the hot path


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "openai"])
def test_engines_whose_templates_take_a_system_turn_anywhere_keep_it_in_place(dialect: Dialect) -> None:
    out, notes = shaped({"messages": CLAUDE_CODE}, backend(dialect))
    assert out["messages"] == [sys("You are Claude Code."), user("hello"), sys("# Environment\n\n# Skills")]
    assert notes == ()


@pytest.mark.parametrize("dialect", ["llamacpp", "litellm"])
def test_leading_only_templates_get_every_system_message_merged_into_the_first(dialect: Dialect) -> None:
    messages = [*CLAUDE_CODE, {"role": "assistant", "content": "ok"}, sys("later")]
    out, _ = shaped({"messages": messages}, backend(dialect))
    leading = "You are Claude Code.\n\n# Environment\n\n# Skills\n\nlater"
    assert out["messages"] == [sys(leading), user("hello"), {"role": "assistant", "content": "ok"}]


def test_a_conversation_without_a_leading_system_prompt_gets_one_where_needed() -> None:
    out, _ = shaped({"messages": [user("hello"), sys("# Skills")]}, backend("llamacpp"))
    assert out["messages"] == [sys("# Skills"), user("hello")]


def test_a_backend_may_say_where_its_system_messages_go() -> None:
    out, _ = shaped({"messages": CLAUDE_CODE}, backend("vllm", system_messages="leading"))
    assert out["messages"][0] == sys("You are Claude Code.\n\n# Environment\n\n# Skills")
    assert len(out["messages"]) == 2


def test_codex_two_developer_messages_become_one_system_message_for_engines() -> None:
    messages = [sys("base", "developer"), sys("permissions", "developer"), user("hi")]
    out, _ = shaped({"messages": messages}, backend("vllm"))
    assert out["messages"] == [sys("base\n\npermissions"), user("hi")]
    out, _ = shaped({"messages": messages}, backend("openai"))  # OpenAI's API knows the role
    assert out["messages"] == [sys("base\n\npermissions", "developer"), user("hi")]


def test_text_parts_of_a_system_message_are_joined_and_the_client_payload_is_untouched() -> None:
    parts = {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    payload = {"messages": [user("hi"), parts, sys("c")]}
    out, _ = shaped(payload, backend("vllm"))
    assert out["messages"][1] == sys("ab\n\nc")
    assert payload["messages"][1] is parts and len(payload["messages"]) == 3


def knobs(effort: str | None = "high", thinking: bool | None = True) -> dict[str, Any]:
    payload: dict[str, Any] = {"messages": [user("hi")]}
    if effort is not None:
        payload["reasoning_effort"] = effort
    if thinking is not None:
        payload["chat_template_kwargs"] = {"thinking": thinking, "enable_thinking": thinking}
    return payload


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_vllm_and_sglang_take_both_knobs(dialect: Dialect) -> None:
    out, notes = shaped(knobs(), backend(dialect))
    assert out["reasoning_effort"] == "high" and out["chat_template_kwargs"]["thinking"] is True
    assert notes == ()
    out, notes = shaped(knobs("xhigh"), backend(dialect))
    assert out["reasoning_effort"] == "high" and "sent as 'high'" in notes[0]


def test_llamacpp_takes_the_thinking_switch_but_no_effort() -> None:
    out, notes = shaped(knobs(), backend("llamacpp"))
    assert "reasoning_effort" not in out and out["chat_template_kwargs"]["enable_thinking"] is True
    assert notes == ("reasoning_effort dropped: llama.cpp takes no effort per request",)


@pytest.mark.parametrize("dialect", ["openai", "litellm"])
def test_apis_take_the_effort_but_no_template_switches(dialect: Dialect) -> None:
    out, notes = shaped(knobs(), backend(dialect))
    assert out["reasoning_effort"] == "high" and "chat_template_kwargs" not in out
    assert len(notes) == 1 and "chat_template_kwargs" in notes[0]


def test_a_model_that_does_not_reason_gets_no_effort_and_one_that_always_does_says_so() -> None:
    out, notes = shaped(knobs(thinking=None), backend("vllm", thinking="none"))
    assert "reasoning_effort" not in out and "does not reason" in notes[0]
    out, notes = shaped(knobs(None, thinking=False), backend("vllm", thinking="mandatory"))
    assert notes == ("thinking stays on: b300 serves a model that always thinks",)


def test_a_role_that_is_not_a_string_is_left_to_the_upstream_to_refuse() -> None:
    # A fuzzer found it: an unhashable role made the set lookup raise (a 500 instead of the upstream's 400).
    messages = [{"role": ["system"], "content": "x"}, {"role": "user", "content": "hi"}]
    assert merged_system_messages(messages, "leading", developer_role=False) is None
