"""The answer in a trace (``telemetry.content: true``, never on a ``private`` route): the GenAI semantic
conventions' ``gen_ai.output.messages`` (docs/gen-ai/gen-ai-output-messages.json of
open-telemetry/semantic-conventions: a JSON array of ``{role, parts, finish_reason}``), written in the
exporter's thread from what the request path kept: a whole answer's body as the upstream sent it, or a
stream's text as its meter saw it go by.

Bounded: at most ``MAX_ANSWER_CHARS`` characters of answer text per request (the rest is cut, and the
message's ``gateway.truncated`` says so), whatever the answer's length; a stream's meter keeps no more than
that either (``measure.transcript.Transcript``) unless it keeps the whole answer anyway, to resume it.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_ANSWER_CHARS = 32_768
# A stream's meter keeps one character more, so that the writer knows when it cut.
KEPT_STREAM_CHARS = MAX_ANSWER_CHARS + 1

# The answer as the request path kept it for the trace: a whole answer's body as the upstream sent it
# (read here, in the exporter's thread), or a stream's text (at most KEPT_STREAM_CHARS) and its finish
# reason.
AnswerRecord = bytes | tuple[str, str | None]


def output_messages(answer: AnswerRecord, operation: str, ok: bool) -> str | None:
    """``gen_ai.output.messages`` as JSON; None when the answer holds no message (an embedding).
    ``ok``: the request succeeded (a message without a finish reason then says "stop", else "error")."""
    if operation == "embeddings":
        return None
    unsaid = "stop" if ok else "error"
    if isinstance(answer, tuple):
        text, finish_reason = answer
        cut = len(text) > MAX_ANSWER_CHARS
        return _json([_message([_text(text[:MAX_ANSWER_CHARS])], finish_reason or unsaid, cut)])
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
