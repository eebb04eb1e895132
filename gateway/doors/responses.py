"""The Responses door, POST /v1/responses (stateless): input items become a chat-completions payload and
a chat completion becomes a Response (reasoning, message and function_call items, usage with
reasoning tokens). Nothing is stored, so a request that needs stored state is refused with a 400.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.api.responses import error_response
from gateway.doors.openai import translated_request
from gateway.doors.reasoning_seal import KEY_ENV, Sealer, sealer_from
from gateway.doors.responses_input import History
from gateway.doors.responses_tools import Toolbox, call_item, chat_tool_choice, tool_notes, toolbox
from gateway.doors.sse import chat_usage, reasoning_of
from gateway.errors import GatewayError, InvalidRequest
from gateway.policy.compiled import CompiledPolicy

if TYPE_CHECKING:
    from gateway.doors import StreamTranslator
    from gateway.request.exchange import ClientRequest, Exchange

# Fields that would need server-side state this gateway does not keep.
STATEFUL = ("previous_response_id", "conversation", "background")
PASSED = ("temperature", "top_p", "user", "safety_identifier", "parallel_tool_calls")


class ResponsesDoor:
    name = "responses"
    upstream_path = "/chat/completions"

    def parse(self, body: bytes, policy: CompiledPolicy, chars_per_token: float) -> ClientRequest:
        state = ResponsesState()
        request = translated_request(body, policy, chars_per_token, lambda given: chat_payload(given, state))
        request.notes = tuple(state.notes)
        request.cache_key = state.cache_key
        request.door_state = state
        return request

    def render_answer(self, raw: bytes, exchange: Exchange) -> bytes:
        assert exchange.client is not None
        client = exchange.client
        shell = response_shell(client.payload, client.route.name, exchange.request_id)
        return orjson.dumps(response_of(orjson.loads(raw), shell, state_of(client)))

    def stream_translator(self, exchange: Exchange) -> StreamTranslator:
        from gateway.doors.responses_stream import ResponsesStream

        assert exchange.client is not None
        client = exchange.client
        shell = response_shell(client.payload, client.route.name, exchange.request_id)
        return ResponsesStream(shell, state_of(client))

    def error_response(self, error: GatewayError) -> Response:
        return error_response(error)


@dataclass(slots=True)
class ResponsesState:
    """What parsing learnt that answering needs: the tools' way back, whether to seal reasoning."""

    tools: Toolbox = field(default_factory=Toolbox)
    sealer: Sealer | None = None  # seals the answer's reasoning: the client asked for encrypted_content
    notes: list[str] = field(default_factory=list)
    cache_key: str | None = None


def state_of(client: ClientRequest) -> ResponsesState:
    state = client.door_state
    return state if isinstance(state, ResponsesState) else ResponsesState()


def chat_payload(request: dict[str, Any], state: ResponsesState | None = None) -> dict[str, Any]:
    state = ResponsesState() if state is None else state
    for field_name in STATEFUL:
        if request.get(field_name):
            raise InvalidRequest(
                f"'{field_name}' needs stored responses, and this gateway is stateless: send the whole"
                " conversation in 'input' instead",
                param=field_name,
            )
    if request.get("store") is True:
        raise InvalidRequest("'store': true is not supported (this gateway keeps no responses); send"
                             " store: false or leave it out", param="store")  # fmt: skip
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    given = request.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"type": "message", "role": "user", "content": given}]
    elif isinstance(given, list) and given:
        items = given
    else:
        raise InvalidRequest("'input' is required: a string or an array of items", param="input")
    given_tools = request.get("tools") or []
    if not isinstance(given_tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    for item in items:  # tools offered along the conversation (Codex's additional_tools)
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            more = item.get("tools")
            given_tools = given_tools + (more if isinstance(more, list) else [])
    state.tools = toolbox(given_tools)
    opener = _sealer(request, items, state)
    cache_key = request.get("prompt_cache_key")
    state.cache_key = cache_key if isinstance(cache_key, str) and cache_key else None
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    history = History(messages, state.tools, opener)
    for n, item in enumerate(items):
        history.add(item, f"input.{n}")
    payload: dict[str, Any] = {"model": request["model"], "messages": messages, "stream": stream}
    limit = request.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidRequest("'max_output_tokens' must be a positive integer", param="max_output_tokens")
        payload["max_tokens"] = limit
    for name in PASSED:
        if request.get(name) is not None:
            payload[name] = request[name]
    _reasoning(request.get("reasoning"), payload, state.notes)
    _text(request.get("text"), payload, state.notes)
    if state.tools.functions:
        payload["tools"] = state.tools.functions
    choice = chat_tool_choice(request.get("tool_choice"), state.tools)
    if choice is not None:
        payload["tool_choice"] = choice
    state.notes += tool_notes(state.tools)
    if history.unopened:
        state.notes.append(
            f"{history.unopened} reasoning item(s) not sealed by this gateway (or altered) were left out"
        )
    return payload


def _sealer(request: dict[str, Any], items: list[Any], state: ResponsesState) -> Sealer | None:
    """The sealer that opens the input's sealed reasoning, if any; ``state.sealer`` seals the answer's
    reasoning when the client asked for ``reasoning.encrypted_content``."""
    include = request.get("include") or []
    if not isinstance(include, list):
        raise InvalidRequest("'include' must be an array", param="include")
    asked = "reasoning.encrypted_content" in include
    sealed = any(
        isinstance(i, dict) and i.get("type") == "reasoning" and i.get("encrypted_content") for i in items
    )
    sealer = sealer_from() if asked or sealed else None
    if asked and sealer is None:
        state.notes.append(f"reasoning.encrypted_content left empty: {KEY_ENV} is not set")
    state.sealer = sealer if asked else None
    return sealer


def _reasoning(reasoning: Any, payload: dict[str, Any], notes: list[str]) -> None:
    """``reasoning.effort`` as chat's ``reasoning_effort`` where chat has that level; ``summary`` is
    accepted (the whole reasoning text comes back, so there is nothing to summarise)."""
    if reasoning is None:
        return
    if not isinstance(reasoning, dict):
        raise InvalidRequest("'reasoning' must be an object", param="reasoning")
    effort = reasoning.get("effort")
    if effort in ("low", "medium", "high"):
        payload["reasoning_effort"] = effort
    elif effort is not None:
        notes.append(f"reasoning.effort {str(effort)[:20]!r} has no chat-completions equivalent; left out")


def _text(text: Any, payload: dict[str, Any], notes: list[str]) -> None:
    """``text.format`` as chat's ``response_format``; ``text.verbosity`` has no chat equivalent."""
    if not isinstance(text, dict):
        return
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        payload["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        payload["response_format"] = {"type": "json_object"}
    if text.get("verbosity") is not None:
        notes.append("text.verbosity has no chat-completions equivalent; left out")


# -- chat completion -> Response ---------------------------------------------------------------------------


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


RESPONSES = ResponsesDoor()
