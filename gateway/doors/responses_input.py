"""The Responses door's input items, in order, as chat messages: messages (developer as system),
function and custom tool calls with their outputs, and earlier reasoning, opened from its seal and
given back with the assistant turn it led to. Hosted tools' items are left out (no upstream reads them).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.doors.reasoning_seal import Sealer
from gateway.doors.responses_tools import Toolbox
from gateway.errors import InvalidRequest

# Items of hosted tools' calls in a conversation's history: nothing upstream can read them.
_HOSTED_KINDS = ("web_search", "file_search", "code_interpreter", "image_generation", "computer", "mcp",
                 "local_shell", "shell", "apply_patch", "tool_search")  # fmt: skip
HOSTED_ITEMS = frozenset(f"{kind}_call{suffix}" for kind in _HOSTED_KINDS for suffix in ("", "_output")) | {
    "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "tool_search_output"
}  # fmt: skip


class History:
    """Input items, in order, as chat messages."""

    def __init__(self, messages: list[dict[str, Any]], tools: Toolbox, sealer: Sealer | None) -> None:
        self.messages = messages
        self.tools = tools
        self.sealer = sealer
        self.reasoning: list[str] = []  # unsealed reasoning waiting for the assistant turn it preceded
        self.unopened = 0
        self.hosted = 0

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where}: must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(
                    f"{where}.role: must be user, assistant, system or developer", param="input"
                )
            # developer -> system: merging consecutive system messages is the backend's side's job.
            message = {"role": "system" if role == "developer" else role, "content": _content(item)}
            self._append(message)
        elif kind in ("function_call", "custom_tool_call"):
            name = self.tools.chat_name(item.get("name"), item.get("namespace"))
            if kind == "function_call":
                arguments = item.get("arguments") or "{}"
            else:
                arguments = orjson.dumps({"input": item.get("input") or ""}).decode()
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = self.messages[-1] if self.messages else None
            if (
                last is not None
                and last["role"] == "assistant"
                and last.get("content") is None
                and not self.reasoning
            ):
                last.setdefault("tool_calls", []).append(call)  # parallel calls share one assistant turn
            else:
                self._append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text = _output_text(item.get("output"))
            self.messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            self._reasoning(item)
        elif kind == "additional_tools":
            return  # its tools were read with the request's own
        elif isinstance(kind, str) and kind in HOSTED_ITEMS:
            return
        else:
            raise InvalidRequest(f"{where}: unsupported input item type {kind!r}", param="input")

    def _append(self, message: dict[str, Any]) -> None:
        if message["role"] == "assistant" and self.reasoning:
            # The model's own earlier reasoning goes back with the turn it led to, as vLLM, SGLang and
            # llama.cpp read it in an assistant message (templates that keep it show it to the model).
            message["reasoning_content"] = "".join(self.reasoning)
        self.reasoning = []
        self.messages.append(message)

    def _reasoning(self, item: dict[str, Any]) -> None:
        blob = item.get("encrypted_content")
        if blob:
            sealer = self.sealer
            text = sealer.open(blob) if sealer is not None else None
            if text is None:
                self.unopened += 1  # another server's, or altered: the model loses it, nothing fails
            else:
                self.reasoning.append(text)
            return
        content = item.get("content") or ()
        if not isinstance(content, list | tuple):
            raise InvalidRequest("input: a reasoning item's 'content' must be an array", param="input")
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "reasoning_text"
                and isinstance(part.get("text"), str)
            ):
                self.reasoning.append(part["text"])


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(p, dict) for p in output):
        texts = [p.get("text") for p in output if p.get("type") in ("input_text", "output_text", "text")]
        if len(texts) == len(output):
            return "".join(t for t in texts if isinstance(t, str))
    return orjson.dumps(output).decode()


def _content(item: dict[str, Any]) -> Any:
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            text = part.get("text", "")
            if not isinstance(text, str):
                raise InvalidRequest("input: a text part's 'text' must be a string", param="input")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts
