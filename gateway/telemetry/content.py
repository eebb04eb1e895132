"""The prompt and the answer in a trace (``telemetry.content: true``, never on a ``private`` route): the
GenAI semantic conventions' ``gen_ai.input.messages`` (docs/gen-ai/gen-ai-input-messages.json: a JSON
array of ``{role, parts}``), written on the request path from the client's payload when it settles, and
``gen_ai.output.messages`` (docs/gen-ai/gen-ai-output-messages.json of
open-telemetry/semantic-conventions: a JSON array of ``{role, parts, finish_reason}``), written by the
exporter as it posts the trace's batch, from what the request path kept: a whole answer's body as the
upstream sent it, or a stream's text as its meter saw it go by.

Bounded: at most ``MAX_ANSWER_CHARS`` characters of prompt text (its first ones: the message where the
bound falls is cut and says ``gateway.truncated``, later ones are left out), and as many of answer text
per request (the rest is cut, and the message's ``gateway.truncated`` says so), whatever the answer's
length; a stream's meter keeps no more than that either (``measure.transcript.Transcript``) unless it
keeps the whole answer anyway, to resume it.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_ANSWER_CHARS = 32_768
# A stream's meter keeps one character more, so that the writer knows when it cut.
KEPT_STREAM_CHARS = MAX_ANSWER_CHARS + 1

# The answer as the request path kept it for the trace: a whole answer's body as the upstream sent it
# (read here, as the exporter posts its batch), or a stream's text, its finish reason and its tool calls (id,
# name, arguments; with the text, at most KEPT_STREAM_CHARS characters).
StreamedCall = tuple[str | None, str | None, str]
StreamedChoice = tuple[str, str | None, tuple[StreamedCall, ...]]
AnswerRecord = bytes | tuple[StreamedChoice, ...]  # a stream: one per choice, in index order


def output_messages(answer: AnswerRecord, operation: str, ok: bool) -> str | None:
    """``gen_ai.output.messages`` as JSON; None when the answer holds no message (an embedding).
    ``ok``: the request succeeded (a message without a finish reason then says "stop", else "error")."""
    if operation == "embeddings":
        return None
    unsaid = "stop" if ok else "error"
    if isinstance(answer, tuple):
        left = MAX_ANSWER_CHARS  # the request's room, over all its choices
        choices_said = []
        for text, finish_reason, calls in answer:
            cut = len(text) > left
            streamed = [_text(text[: max(left, 0)])] if text or not calls else []
            left -= len(text)
            for call_id, name, called in calls:
                kept = called[: max(left, 0)]
                cut = cut or len(kept) < len(called)
                left -= len(called)
                streamed.append({"type": "tool_call", "id": call_id, "name": name, "arguments": kept})
            choices_said.append(_message(streamed, finish_reason or unsaid, cut))
        return _json(choices_said)
    try:
        body = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list):
        return None
    room = MAX_ANSWER_CHARS
    messages = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        said = choice.get("message")
        message: dict[str, Any] = said if isinstance(said, dict) else {}
        content = message.get("content") if "message" in choice else choice.get("text")
        parts: list[dict[str, Any]] = []
        cut = False
        if isinstance(content, str) and content:
            cut = len(content) > room
            parts.append(_text(content[: max(room, 0)]))
            room -= len(content)
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict):
                named = call.get("function")
                function: dict[str, Any] = named if isinstance(named, dict) else {}
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    kept = arguments[: max(room, 0)]
                    cut = cut or len(kept) < len(arguments)
                    room -= len(arguments)
                    arguments = kept
                parts.append(
                    {
                        "type": "tool_call",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": arguments,
                    }
                )
        reason = choice.get("finish_reason")
        messages.append(_message(parts, reason if isinstance(reason, str) else unsaid, cut))
    return _json(messages) if messages else None


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _message(parts: list[dict[str, Any]], finish_reason: str, cut: bool) -> dict[str, Any]:
    # finish_reason is required by the schema, even of a stream cut before its last chunk said one.
    message: dict[str, Any] = {"role": "assistant", "parts": parts, "finish_reason": finish_reason}
    if cut:
        message["gateway.truncated"] = True
    return message


def _json(messages: list[dict[str, Any]]) -> str:
    return orjson.dumps(messages).decode()


def input_messages(prompt: object) -> str:
    """``gen_ai.input.messages`` as JSON, from a door's prompt field: chat ``messages``, a completion's
    ``prompt`` (a text or a list of them), or a Responses ``input`` (a text or a list of items). Text,
    tool calls and tool results become parts; any other part (an image) only its type: its data could
    be megabytes."""
    items: list[Any]
    if isinstance(prompt, str):
        items = [prompt]
    elif isinstance(prompt, list):
        items = prompt
    else:
        items = []
    room = MAX_ANSWER_CHARS
    messages: list[dict[str, Any]] = []
    for item in items:
        if room <= 0:
            messages[-1]["gateway.truncated"] = True
            break
        if isinstance(item, str):
            role, parts, room = "user", *_bounded_parts([_text(item)], room)
        elif isinstance(item, dict) and (found := _role_and_parts(item)) is not None:
            role, said = found
            parts, room = _bounded_parts(said, room)
        else:
            continue
        message: dict[str, Any] = {"role": role, "parts": parts}
        if room < 0:
            message["gateway.truncated"] = True
        messages.append(message)
    return _json(messages)


def _role_and_parts(item: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    kind = item.get("type")
    if kind == "function_call":  # Responses: a call the model made earlier in the conversation
        call = {"type": "tool_call", "id": item.get("call_id"), "name": item.get("name")}
        return "assistant", [{**call, "arguments": item.get("arguments")}]
    if kind == "function_call_output":
        return "tool", [
            {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}
        ]
    role = item.get("role")
    if not isinstance(role, str):
        if kind not in (None, "message"):  # a Responses item of another kind (reasoning...): not said
            return None
        role = "user"
    content = item.get("content")
    if role == "tool":  # chat: a tool's result
        return role, [{"type": "tool_call_response", "id": item.get("tool_call_id"), "response": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append(_text(content))
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str) and part.get("type") in ("text", "input_text", "output_text"):
                    parts.append(_text(text))
                else:
                    parts.append({"type": str(part.get("type") or "unknown")})
    for call in item.get("tool_calls") or ():
        if isinstance(call, dict):
            named = call.get("function")
            function: dict[str, Any] = named if isinstance(named, dict) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
    return role, parts


# The field of each part kind that holds free text, the one the bound counts.
_FREE_TEXT = {"text": "content", "tool_call": "arguments", "tool_call_response": "response"}


def _bounded_parts(parts: list[dict[str, Any]], room: int) -> tuple[list[dict[str, Any]], int]:
    """The parts with at most ``room`` characters of free text; the room left (below 0: cut)."""
    kept = []
    for part in parts:
        field = _FREE_TEXT.get(part["type"])
        value = part.get(field) if field is not None else None
        if value is not None and not isinstance(value, str):
            value = orjson.dumps(value).decode()  # a tool's structured result
        if isinstance(value, str) and field is not None:
            part = {**part, field: value[: max(room, 0)]}
            room -= len(value)
        kept.append(part)
        if room < 0:
            break
    return kept, room
