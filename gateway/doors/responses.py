"""The Responses door, POST /v1/responses (stateless): input items become a chat-completions payload and
a chat completion becomes a Response (reasoning, message and function_call items, usage with
reasoning tokens). Nothing is stored, so a request that needs stored state is refused with a 400.
Below the door: the Response's shape (``responses_answer``) and the stream translator built on it
(``responses_stream``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.doors.openai import translated_request
from gateway.doors.reasoning_seal import KEY_ENV, Sealer, sealer_from
from gateway.doors.responses_answer import ResponsesState, response_of, response_shell
from gateway.doors.responses_input import History
from gateway.doors.responses_stream import ResponsesStream
from gateway.doors.responses_tools import chat_tool_choice, tool_notes, toolbox
from gateway.errors import GatewayError, InvalidRequest, error_response
from gateway.policy.compiled import CompiledPolicy

if TYPE_CHECKING:
    from gateway.doors import Answering, ClientRequest, StreamTranslator

# Fields that would need server-side state this gateway does not keep.
STATEFUL = ("previous_response_id", "conversation", "background")
PASSED = ("temperature", "top_p", "user", "safety_identifier", "parallel_tool_calls")


class ResponsesDoor:
    name = "responses"
    upstream_path = "/chat/completions"

    def parse(
        self, body: bytes, policy: CompiledPolicy, chars_per_token: float, caller: str = ""
    ) -> ClientRequest:
        state = ResponsesState()
        request = translated_request(
            body, policy, chars_per_token, lambda given: chat_payload(given, state, caller)
        )
        request.notes = tuple(state.notes)
        request.cache_key = state.cache_key
        request.door_state = state
        return request

    def render_answer(self, raw: bytes, exchange: Answering) -> bytes:
        assert exchange.client is not None
        client = exchange.client
        shell = response_shell(client.payload, client.route.name, exchange.request_id)
        return orjson.dumps(response_of(orjson.loads(raw), shell, state_of(client)))

    def stream_translator(self, exchange: Answering) -> StreamTranslator:
        assert exchange.client is not None
        client = exchange.client
        shell = response_shell(client.payload, client.route.name, exchange.request_id)
        return ResponsesStream(shell, state_of(client))

    def error_response(self, error: GatewayError) -> Response:
        return error_response(error)


def state_of(client: ClientRequest) -> ResponsesState:
    state = client.door_state
    return state if isinstance(state, ResponsesState) else ResponsesState()


def chat_payload(
    request: dict[str, Any], state: ResponsesState | None = None, caller: str = ""
) -> dict[str, Any]:
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
    opener = _sealer(request, items, state, caller)
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
            f"{history.unopened} reasoning item(s) not sealed by this gateway (or for another API key,"
            " expired or altered) were left out"
        )
    return payload


def _sealer(request: dict[str, Any], items: list[Any], state: ResponsesState, caller: str) -> Sealer | None:
    """The sealer of ``caller``'s blobs that opens the input's sealed reasoning, if any; ``state.sealer``
    seals the answer's reasoning when the client asked for ``reasoning.encrypted_content``."""
    include = request.get("include") or []
    if not isinstance(include, list):
        raise InvalidRequest("'include' must be an array", param="include")
    asked = "reasoning.encrypted_content" in include
    sealed = any(
        isinstance(i, dict) and i.get("type") == "reasoning" and i.get("encrypted_content") for i in items
    )
    sealer = sealer_from(caller) if asked or sealed else None
    if asked and sealer is None:
        state.notes.append(f"reasoning.encrypted_content left empty: {KEY_ENV} is not set (or too short)")
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


RESPONSES = ResponsesDoor()
