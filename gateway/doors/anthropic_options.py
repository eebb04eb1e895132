"""What a Messages request asks for beyond its messages, in what the upstream understands: its tools
(client tools become functions; hosted tools are never faked as functions), thinking and effort (the
chat fields that ``backends.chat_shape`` then fits to each engine), and context management.

Whatever has no equivalent is left out with a note the answer carries in ``x-gateway-notes``.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

# Tools Anthropic's servers run (search, fetch, code execution, tool search, MCP): no backend here
# runs them, and a function of the same name would be "called" with nobody to answer it.
HOSTED_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_")
# Anthropic's efforts (output_config.effort) in the chat vocabulary (reasoning_effort).
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
# A thinking budget, when no effort is given, as the effort nearest to it.
BUDGET_EFFORTS = ((4_096, "low"), (16_384, "medium"))
THINKING_TYPES = ("enabled", "adaptive", "disabled")


def chat_tools(
    tools: list[Any], messages: list[Any], payload: dict[str, Any], notes: list[str]
) -> dict[str, str]:
    """Client tools into ``payload["tools"]`` as functions; the hosted ones left out, each with a note.
    Returns the names of those left out, with their types.

    A ``defer_loading`` tool is offered only once a tool search in ``messages`` has referenced it, as
    Anthropic's API loads it then: until then the model does not know it (nor would a small model
    pick a placeholder as its first tool)."""
    functions: list[dict[str, Any]] = []
    dropped: dict[str, str] = {}
    referenced: set[str] | None = None
    for n, tool in enumerate(tools):
        where = f"tools.{n}"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        kind = tool.get("type")
        if kind in (None, "custom"):
            if tool.get("defer_loading") is True:
                referenced = referenced_tools(messages) if referenced is None else referenced
                if str(tool.get("name")) not in referenced:
                    continue
            functions.append(_function(tool, where))
            continue
        name = str(tool.get("name") or kind)
        dropped[name] = str(kind)
        why = "a server tool" if str(kind).startswith(HOSTED_TOOL_PREFIXES) else "an Anthropic-defined tool"
        notes.append(f"{where} {name} ({kind}) dropped: {why} that no backend here runs")
    if dropped and not functions:
        # The request is there for the hosted tool (Claude Code's WebSearch asks for web_search and
        # nothing else): answered without it, the model's own words would pass for search results.
        name, kind = next(iter(dropped.items()))
        raise InvalidRequest(
            f"tools: '{name}' ({kind}) is a server tool that no backend of this gateway runs, "
            "and no client tool is left to answer with",
            param="tools",
        )
    if functions:
        payload["tools"] = functions
    return dropped


def referenced_tools(messages: list[Any]) -> set[str]:
    """The tools that tool results in ``messages`` named with ``tool_reference`` blocks."""
    names: set[str] = set()
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            inner = block.get("content") if isinstance(block, dict) else None
            if block.get("type") != "tool_result" or not isinstance(inner, list):
                continue
            names.update(
                str(ref.get("tool_name"))
                for ref in inner
                if isinstance(ref, dict) and ref.get("type") == "tool_reference"
            )
    return names


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise InvalidRequest(f"{where}.name: required", param=where)
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def reasoning_knobs(request: dict[str, Any], payload: dict[str, Any], notes: list[str]) -> None:
    """``thinking`` as the thinking switch chat templates read (``chat_template_kwargs``: Kimi and
    DeepSeek say ``thinking``, Qwen ``enable_thinking``), ``output_config.effort`` (or a thinking
    budget) as ``reasoning_effort``."""
    thinking = request.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is not None and kind not in THINKING_TYPES:
        raise InvalidRequest(f"thinking.type: must be one of {', '.join(THINKING_TYPES)}", param="thinking")
    config = request.get("output_config")
    effort = config.get("effort") if isinstance(config, dict) else None
    if effort is not None and (not isinstance(effort, str) or effort not in EFFORTS):
        raise InvalidRequest(
            f"output_config.effort: must be one of {', '.join(EFFORTS)}", param="output_config.effort"
        )
    if kind is not None:
        on = kind != "disabled"
        payload["chat_template_kwargs"] = {"thinking": on, "enable_thinking": on}
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if kind == "enabled" and effort is None and isinstance(budget, int) and not isinstance(budget, bool):
        effort = next((name for most, name in BUDGET_EFFORTS if budget <= most), "high")
        notes.append(f"thinking.budget_tokens {budget} sent as reasoning_effort {effort!r}")
    if effort is not None and kind != "disabled":
        payload["reasoning_effort"] = EFFORTS[effort]


def context_notes(request: dict[str, Any], notes: list[str]) -> None:
    """Context edits the gateway does not make. Clearing thinking needs nothing: earlier thinking is
    never sent upstream (``anthropic._chat_messages``)."""
    management = request.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    for edit in edits if isinstance(edits, list) else ():
        kind = edit.get("type") if isinstance(edit, dict) else None
        if isinstance(kind, str) and not kind.startswith("clear_thinking_"):
            notes.append(f"context_management edit {kind} not applied: the conversation goes as sent")
    if request.get("mcp_servers"):
        notes.append("mcp_servers dropped: no backend here connects to MCP servers")
