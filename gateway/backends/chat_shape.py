"""The chat payload as one backend can take it, shaped right before it is sent (every door's requests,
and the continuations of resumed streams, pass here).

- System messages: a run of consecutive ``system``/``developer`` messages becomes one (Codex sends its
  prompt as two developer messages, Claude Code adds its own mid-conversation); ``developer`` becomes
  ``system`` for engines whose chat templates know no such role; and where the backend's template takes
  a system prompt only at the start, later ones are merged into it (``SYSTEM_MESSAGES``).
- Reasoning knobs: ``reasoning_effort`` and ``chat_template_kwargs`` (the thinking switches vLLM,
  SGLang and llama.cpp hand to the chat template) go where the engine reads them; elsewhere they are
  dropped, and each drop is named in a note the answer carries (``x-gateway-notes``).

A payload that needs none of this is returned as it came, after one look at each message's role.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gateway.policy.compiled import CompiledBackend
from gateway.policy.schema import SystemMessages

# Where a mid-conversation system message goes, by dialect (a backend's ``system_messages`` wins):
# - vllm, sglang: in place. Kimi K2/K3's templates render a system turn anywhere; so do Qwen3's and
#   DeepSeek's. A model whose template refuses one says ``system_messages: leading`` in its backend.
# - openai: in place: OpenAI's API takes system and developer messages anywhere.
# - llamacpp: leading. Gemma has no system role: its own template takes one system message, first
#   (a later one raises "Conversation roles must alternate" or becomes a turn role it never saw), and
#   llama.cpp's built-in gemma template prepends system text to the next user turn, so one after the
#   last user turn is lost without a word (tests/real/test_real_system_messages.py).
# - litellm: leading. Provider APIs behind it (Anthropic, Gemini) have one system prompt.
SYSTEM_MESSAGES: Mapping[str, SystemMessages] = MappingProxyType(
    {
        "vllm": "in_place",
        "sglang": "in_place",
        "openai": "in_place",
        "llamacpp": "leading",
        "litellm": "leading",
    }
)
SYSTEM_ROLES = frozenset({"system", "developer"})
# The engines that read ``chat_template_kwargs`` (and pass them to the model's chat template).
TEMPLATE_KWARGS_DIALECTS = frozenset({"vllm", "sglang", "llamacpp"})
# The efforts each engine accepts (vLLM and SGLang validate low/medium/high); others are clamped.
ENGINE_EFFORTS: Mapping[str, str] = MappingProxyType(
    {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
)


def shaped(payload: dict[str, Any], backend: CompiledBackend) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``payload`` as ``backend`` can take it (the same dict when nothing changes), and notes on what
    was dropped."""
    dialect = backend.dialect
    notes: list[str] = []
    out = payload
    messages = payload.get("messages")
    if isinstance(messages, list):
        placement = backend.system_messages or SYSTEM_MESSAGES.get(dialect, "leading")
        merged = merged_system_messages(messages, placement, developer_role=dialect == "openai")
        if merged is not None:
            out = {**payload, "messages": merged}
    if "reasoning_effort" in payload or "chat_template_kwargs" in payload:
        out = dict(out) if out is payload else out
        _shape_reasoning(out, backend, notes)
    return out, tuple(notes)


def merged_system_messages(
    messages: list[Any], placement: SystemMessages, *, developer_role: bool
) -> list[Any] | None:
    """The messages with system turns merged as ``placement`` says; None when nothing changes."""
    if not _needs_merging(messages, placement, developer_role):
        return None
    out: list[Any] = []
    leading: dict[str, Any] | None = None  # placement "leading": the one system prompt, first
    run: dict[str, Any] | None = None  # placement "in_place": the system message just before
    for message in messages:
        role = _role(message)
        if role not in SYSTEM_ROLES:
            out.append(message)
            run = None
            continue
        text = _text(message.get("content"))
        merged_into = leading if placement == "leading" else run
        if merged_into is not None:
            merged_into["content"] = _joined(merged_into["content"], text)
            continue
        opened = {"role": role if developer_role else "system", "content": text}
        if placement == "leading":
            leading = opened
            out.insert(0, opened)
        else:
            run = opened
            out.append(opened)
    return out


def _needs_merging(messages: list[Any], placement: SystemMessages, developer_role: bool) -> bool:
    previous_system = False
    for position, message in enumerate(messages):
        role = _role(message)
        is_system = role in SYSTEM_ROLES
        if is_system and (
            previous_system
            or (role == "developer" and not developer_role)
            or (placement == "leading" and position > 0)
        ):
            return True
        previous_system = is_system
    return False


def _role(message: Any) -> str | None:
    """A message's role when it has one a set can hold (a fuzzer's role may be a list)."""
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _joined(first: str, second: str) -> str:
    return second if not first else first if not second else f"{first}\n\n{second}"


def _shape_reasoning(payload: dict[str, Any], backend: CompiledBackend, notes: list[str]) -> None:
    dialect = backend.dialect
    switches = payload.get("chat_template_kwargs")
    if isinstance(switches, dict) and switches.get("thinking") is False and backend.thinking == "mandatory":
        notes.append(f"thinking stays on: {backend.name} serves a model that always thinks")
    if "chat_template_kwargs" in payload and dialect not in TEMPLATE_KWARGS_DIALECTS:
        del payload["chat_template_kwargs"]  # an API that is not an engine refuses unknown fields
        notes.append(f"thinking switch (chat_template_kwargs) dropped: a {dialect} backend takes none")
    effort = payload.get("reasoning_effort")
    if effort is None:
        return
    if backend.thinking == "none":
        del payload["reasoning_effort"]
        notes.append(f"reasoning_effort dropped: {backend.name} serves a model that does not reason")
    elif dialect in ("vllm", "sglang"):
        engine_effort = ENGINE_EFFORTS.get(str(effort))
        if engine_effort is None:
            del payload["reasoning_effort"]
            notes.append(f"reasoning_effort {effort!r} dropped: {dialect} takes low, medium or high")
        elif engine_effort != effort:
            payload["reasoning_effort"] = engine_effort
            notes.append(f"reasoning_effort {effort!r} sent as {engine_effort!r}: {dialect} takes no more")
    elif dialect == "llamacpp":
        del payload["reasoning_effort"]
        notes.append("reasoning_effort dropped: llama.cpp takes no effort per request")


# The engines whose prefix cache a request's ``cache_salt`` isolates (docs/contracts/vllm.yaml and
# sglang.yaml, prefix_cache.salt). llama-server has none (llamacpp.yaml), and a paid API would refuse
# an argument it does not know (and isolates organisations itself): neither is sent one.
SALTED_DIALECTS = frozenset(("vllm", "sglang"))


def with_cache_salt(payload: dict[str, Any], salt: str | None, backend: CompiledBackend) -> None:
    """The request's salt into an upstream body for an engine that isolates by it (the scope's own,
    replacing any the client sent); nothing for the fleet's scope or another backend."""
    if salt is not None and backend.dialect in SALTED_DIALECTS:
        payload["cache_salt"] = salt
