"""The Anthropic Messages door, POST /v1/messages: a Messages request becomes a chat-completions payload,
and a chat completion becomes a Message (thinking, text and tool_use blocks, stop_reason, usage).

The pure translations (``chat_payload``, ``message_of``) are shared with the emulator's ``anthropic``
profile. Below the door: the Message's shape (``anthropic_message``) and the stream translator built on
it (``anthropic_stream``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from gateway.doors.anthropic_errors import error_body as error_body
from gateway.doors.anthropic_identity import user_and_session  # its users import it from here
from gateway.doors.anthropic_message import message_of
from gateway.doors.anthropic_options import chat_tools, context_notes, reasoning_knobs
from gateway.doors.anthropic_stream import MessagesStream
from gateway.doors.openai import translated_request
from gateway.errors import GatewayError, InvalidRequest
from gateway.policy.compiled import CompiledPolicy

if TYPE_CHECKING:
    from gateway.doors import Answering, ClientRequest, StreamTranslator

# Messages fields with a chat-completions name of their own; the rest of theirs has no equivalent.
RENAMED = {"stop_sequences": "stop", "temperature": "temperature", "top_p": "top_p"}
BILLING_HEADER = "x-anthropic-billing-header:"


class AnthropicDoor:
    name = "messages"
    upstream_path = "/chat/completions"

    def parse(
        self, body: bytes, policy: CompiledPolicy, chars_per_token: float, caller: str = ""
    ) -> ClientRequest:
        notes: list[str] = []
        sessions: list[str] = []
        client = translated_request(  # message_delta carries the usage
            body, policy, chars_per_token, lambda request: chat_payload(request, notes, sessions)
        )
        client.notes = tuple(notes)
        if sessions:  # Claude Code's session: the conversation's key for the prefix index
            client.cache_key = sessions[0]
        return client

    def render_answer(self, raw: bytes, exchange: Answering) -> bytes:
        assert exchange.client is not None
        return orjson.dumps(message_of(orjson.loads(raw), exchange.client.route.name))

    def stream_translator(self, exchange: Answering) -> StreamTranslator:
        assert exchange.client is not None
        client = exchange.client
        return MessagesStream(client.route.name, client.prompt_tokens, exchange.request_id)

    def error_response(self, error: GatewayError) -> Response:
        return Response(
            error_body(error.status, error.message),
            status_code=error.status,
            headers=error.headers(),
            media_type="application/json",
        )


# -- Messages request -> chat payload --------------------------------------------------------------------


def chat_payload(
    request: dict[str, Any], notes: list[str] | None = None, sessions: list[str] | None = None
) -> dict[str, Any]:
    """The chat-completions payload of a Messages request; InvalidRequest names what is wrong. What it
    leaves out (hosted tools, context edits) is said in ``notes``; the session its ``metadata.user_id``
    names (Claude Code's), in ``sessions``."""
    notes = [] if notes is None else notes
    max_tokens = request.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("max_tokens: Field required (a positive integer)", param="max_tokens")
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: must be a non-empty array", param="messages")
    chat: list[dict[str, Any]] = []
    system = _system_text(request.get("system") or "", "system")
    if system:
        chat.append({"role": "system", "content": system})
    for n, message in enumerate(messages):
        chat.extend(_chat_messages(message, f"messages.{n}"))
    payload: dict[str, Any] = {"model": request["model"], "messages": chat, "max_tokens": max_tokens}
    payload["stream"] = stream
    for theirs, ours in RENAMED.items():
        if request.get(theirs) is not None:
            payload[ours] = request[theirs]
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array", param="tools")
    hosted = chat_tools(tools or [], messages, payload, notes)
    choice = request.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "tool" and str(choice.get("name")) in hosted:
            name = str(choice["name"])
            raise InvalidRequest(
                f"tool_choice: '{name}' is a server tool ({hosted[name]}) that no backend of this "
                "gateway runs; offer it as a client tool (with an input_schema) instead",
                param="tool_choice",
            )
        if payload.get("tools"):
            payload["tool_choice"] = _chat_tool_choice(choice)
        if choice.get("disable_parallel_tool_use") and payload.get("tools"):
            payload["parallel_tool_calls"] = False
    reasoning_knobs(request, payload, notes)
    context_notes(request, notes)
    metadata = request.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        # Split before the identity is taken out (request/privacy.py): the user part is the user.
        payload["user"], session = user_and_session(metadata["user_id"])
        if session is not None and sessions is not None:
            sessions.append(session)
    return payload


def _chat_messages(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise InvalidRequest(f"{where}.role: must be 'user', 'assistant' or 'system'", param=where)
    role, content = message["role"], message.get("content")
    if role == "system":  # mid-conversation (Claude Code's agent and skill lists): placed per backend
        text = _system_text(content, f"{where}.content")
        return [{"role": "system", "content": text}] if text else []
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of blocks", param=where)
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for n, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": _block_text(block, f"{where}.content.{n}")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
        elif kind == "tool_use" and role == "assistant":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            call = {"id": block.get("id"), "type": "function", "function": {"name": block.get("name")}}
            call["function"]["arguments"] = arguments
            tool_calls.append(call)
        elif kind == "tool_result" and role == "user":
            text = _text_of(block.get("content") or "", f"{where}.content.{n}.content")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the model's own earlier thinking: not sent back upstream
        elif kind == "server_tool_use" or (isinstance(kind, str) and kind.endswith("_tool_result")):
            continue  # a hosted tool's call and result from an earlier turn answered elsewhere
        else:
            raise InvalidRequest(f"{where}.content.{n}: unsupported block type {kind!r}", param=where)
    out: list[dict[str, Any]] = list(results)  # tool results answer the previous assistant turn first
    if parts or tool_calls:
        text_only = all(part["type"] == "text" for part in parts)
        body: Any = "".join(part["text"] for part in parts) if text_only else parts
        chat: dict[str, Any] = {"role": role, "content": body if parts else None}
        if tool_calls:
            chat["tool_calls"] = tool_calls
        out.append(chat)
    return out


def _text_of(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        blocks = enumerate(value)
        return "".join(
            _block_text(b, f"{where}.{n}")
            for n, b in blocks
            if isinstance(b, dict) and b.get("type") == "text"
        )
    raise InvalidRequest(f"{where}: must be a string or an array of text blocks", param=where)


def _system_text(value: Any, where: str) -> str:
    """A system prompt's text blocks, one paragraph each; Claude Code's billing header block is the
    transport's, not the model's (and changes with every client version: it would defeat prefix
    caching), so it is left out."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: must be a string or an array of text blocks", param=where)
    texts = (
        _block_text(block, f"{where}.{n}")
        for n, block in enumerate(value)
        if isinstance(block, dict) and block.get("type") == "text"
    )
    return "\n\n".join(text for text in texts if text and not text.startswith(BILLING_HEADER))


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text", "")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.text: must be a string", param=where)
    return text


def _image_url(source: Any) -> str:
    if isinstance(source, dict) and source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if isinstance(source, dict) and source.get("type") == "url":
        return str(source.get("url"))
    raise InvalidRequest("image.source: must be a base64 or url source", param="messages")


def _chat_tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")


MESSAGES = AnthropicDoor()
