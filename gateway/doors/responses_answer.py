"""A chat completion as an OpenAI Response: the shell of fields that do not depend on the answer, the
whole Response (``response_of``) and the items and usage a streamed one shares with it; and
``ResponsesState``, what parsing a request learnt that answering it needs. The door and its stream
translator both sit above this module."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.doors.reasoning_seal import Sealer
from gateway.doors.responses_tools import Toolbox, call_item
from gateway.doors.sse import chat_usage, reasoning_of


@dataclass(slots=True)
class ResponsesState:
    """What parsing learnt that answering needs: the tools' way back, whether to seal reasoning."""

    tools: Toolbox = field(default_factory=Toolbox)
    sealer: Sealer | None = None  # seals the answer's reasoning: the client asked for encrypted_content
    notes: list[str] = field(default_factory=list)
    cache_key: str | None = None


def response_shell(payload: dict[str, Any], model: str, request_id: str) -> dict[str, Any]:
    """The Response object's fields that do not depend on the answer."""
    tools = [{"type": "function", **t["function"]} for t in payload.get("tools") or ()]
    tool_choice = payload.get("tool_choice", "auto")
    if isinstance(tool_choice, dict):
        tool_choice = {"type": "function", "name": tool_choice["function"]["name"]}
    return {
        "id": f"resp_{request_id.replace('-', '')}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "tool_choice": tool_choice,
        "tools": tools,
        "temperature": payload.get("temperature"),
        "top_p": payload.get("top_p"),
        "max_output_tokens": payload.get("max_tokens"),
        "previous_response_id": None,
        "store": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": None,
    }


def response_of(
    completion: Any, shell: dict[str, Any], state: ResponsesState | None = None
) -> dict[str, Any]:
    state = ResponsesState() if state is None else state
    choice = (completion.get("choices") or [{}])[0] if isinstance(completion, dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(reasoning_item(item_id("rs"), reasoning, sealer=state.sealer))
    if message.get("content"):
        output.append(message_item(item_id("msg"), message["content"]))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(call_item(item_id("fc"), call.get("id") or item_id("call"), function.get("name") or "",
                                function.get("arguments") or "", state.tools))  # fmt: skip
    return finished(shell, output, choice.get("finish_reason"), completion.get("usage"))


def finished(shell: dict[str, Any], output: list[dict[str, Any]], finish: Any, usage: Any) -> dict[str, Any]:
    done = {**shell, "output": output, "usage": usage_of(usage), "status": "completed"}
    if finish == "length":
        done["status"] = "incomplete"
        done["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish == "content_filter":
        done["status"] = "incomplete"
        done["incomplete_details"] = {"reason": "content_filter"}
    return done


def usage_of(usage: Any) -> dict[str, Any]:
    prompt, cached, completion, reasoning = chat_usage(usage)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def reasoning_item(
    item: str, text: str, status: str = "completed", sealer: Sealer | None = None
) -> dict[str, Any]:
    done = {"id": item, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip
    if sealer is not None and status == "completed":
        # Stateless round trip: the client sends this back with the next turn, and only we can read it.
        done["encrypted_content"] = sealer.seal(text)
    return done


def message_item(item: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item, "type": "message", "status": status, "role": "assistant", "content": content}


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"
