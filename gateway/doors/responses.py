"""The Responses door, POST /v1/responses (stateless): input items become a chat-completions payload and
a chat completion becomes a Response (reasoning, message and function_call items, usage with
reasoning tokens). Nothing is stored, so a request that needs stored state is refused with a 400.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.api.responses import error_response
from gateway.doors.openai import translated_request
from gateway.doors.sse import chat_usage, reasoning_of
from gateway.errors import GatewayError, InvalidRequest
from gateway.policy.compiled import CompiledPolicy

if TYPE_CHECKING:
    from gateway.doors import StreamTranslator
    from gateway.request.exchange import ClientRequest, Exchange

# Fields that would need server-side state this gateway does not keep.
STATEFUL = ("previous_response_id", "conversation", "background")
PASSED = ("temperature", "top_p", "user", "parallel_tool_calls")


class ResponsesDoor:
    name = "responses"
    upstream_path = "/chat/completions"

    def parse(self, body: bytes, policy: CompiledPolicy, chars_per_token: float) -> ClientRequest:
        return translated_request(
            body, policy, chars_per_token, chat_payload
        )  # response.completed carries the usage

    def render_answer(self, raw: bytes, exchange: Exchange) -> bytes:
        assert exchange.client is not None
        shell = response_shell(exchange.client.payload, exchange.client.route.name, exchange.request_id)
        return orjson.dumps(response_of(orjson.loads(raw), shell))

    def stream_translator(self, exchange: Exchange) -> StreamTranslator:
        from gateway.doors.responses_stream import ResponsesStream

        assert exchange.client is not None
        client = exchange.client
        return ResponsesStream(response_shell(client.payload, client.route.name, exchange.request_id))

    def error_response(self, error: GatewayError) -> Response:
        return error_response(error)


def chat_payload(request: dict[str, Any]) -> dict[str, Any]:
    for field in STATEFUL:
        if request.get(field):
            raise InvalidRequest(
                f"'{field}' needs stored responses, and this gateway is stateless: send the whole"
                " conversation in 'input' instead",
                param=field,
            )
    if request.get("store") is True:
        raise InvalidRequest("'store': true is not supported (this gateway keeps no responses); send"
                             " store: false or leave it out", param="store")  # fmt: skip
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = request.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for n, item in enumerate(given):
            _add_item(messages, item, f"input.{n}")
    else:
        raise InvalidRequest("'input' is required: a string or an array of items", param="input")
    payload: dict[str, Any] = {"model": request["model"], "messages": messages, "stream": stream}
    limit = request.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidRequest("'max_output_tokens' must be a positive integer", param="max_output_tokens")
        payload["max_tokens"] = limit
    for field in PASSED:
        if request.get(field) is not None:
            payload[field] = request[field]
    given_tools = request.get("tools") or ()
    if not isinstance(given_tools, list | tuple):
        raise InvalidRequest("'tools' must be an array", param="tools")
    tools = [_chat_tool(t) for t in given_tools if isinstance(t, dict)]
    if tools:
        payload["tools"] = tools
    choice = request.get("tool_choice")
    if isinstance(choice, str):
        payload["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        payload["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return payload


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where}: must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"{where}.role: must be user, assistant, system or developer", param="input")
        messages.append({"role": "system" if role == "developer" else role, "content": _content(item)})
    elif kind == "function_call":
        function = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
        call = {"id": item.get("call_id"), "type": "function", "function": function}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and last.get("content") is None:
            last.setdefault("tool_calls", []).append(call)  # parallel calls share one assistant turn
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else orjson.dumps(output).decode()
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    elif kind == "reasoning":
        return  # the model's earlier reasoning is not sent back upstream
    else:
        raise InvalidRequest(f"{where}: unsupported input item type {kind!r}", param="input")


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


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise InvalidRequest(
            f"tool type {tool.get('type')!r} is not supported; only 'function'", param="tools"
        )
    function = {
        k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
    }
    return {"type": "function", "function": function}


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


def response_of(completion: Any, shell: dict[str, Any]) -> dict[str, Any]:
    choice = (completion.get("choices") or [{}])[0] if isinstance(completion, dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(reasoning_item(item_id("rs"), reasoning))
    if message.get("content"):
        output.append(message_item(item_id("msg"), message["content"]))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(function_item(item_id("fc"), call.get("id") or item_id("call"),
                                    function.get("name") or "", function.get("arguments") or ""))  # fmt: skip
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


def reasoning_item(item: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def message_item(item: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item, "type": "message", "status": status, "role": "assistant", "content": content}


def function_item(
    item: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {"id": item, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}  # fmt: skip


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


RESPONSES = ResponsesDoor()
