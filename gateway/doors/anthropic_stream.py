"""The Messages door's stream translator: OpenAI chat chunks in, the Anthropic event sequence out.

message_start and a ping with the first event, then one content block at a time (thinking with
thinking_delta, text with text_delta, tool_use with input_json_delta), then message_delta (stop_reason
and the upstream's usage) and message_stop at ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from gateway.doors.anthropic_errors import error_body
from gateway.doors.anthropic_message import STOP_REASONS, message_id, tool_use_id, usage_of
from gateway.doors.sse import named_event, reasoning_of, upstream_objects


class MessagesStream:
    __slots__ = ("_block", "_index", "_model", "_prompt_tokens", "_request_id", "_started", "_stop",
                 "_tools", "_usage")  # fmt: skip

    def __init__(self, model: str, prompt_tokens: int, request_id: str) -> None:
        self._model = model
        self._prompt_tokens = prompt_tokens  # the estimate message_start carries; message_delta corrects it
        self._request_id = request_id
        self._started = False
        self._block: str | None = None  # the open content block's type
        self._index = -1
        self._tools: dict[int, int] = {}  # upstream tool_call index -> our block index
        self._stop: str | None = None
        self._usage: Any = None

    def translate(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for obj in upstream_objects(events):
            if not self._started:
                self._started = True
                out.append(self._message_start(obj))
                out.append(b'event: ping\ndata: {"type":"ping"}\n\n')
            if obj == "[DONE]":
                out.append(self._finish())
            elif isinstance(obj, dict):
                self._chunk(obj, out)
        return b"".join(out)

    def error(self, message: str, code: str) -> bytes:
        return (
            b"event: error\ndata: "
            + error_body(529 if code == "upstream_timeout" else 500, message)
            + b"\n\n"
        )

    def _message_start(self, obj: Any) -> bytes:
        upstream_id = obj.get("id") if isinstance(obj, dict) else None
        message: dict[str, Any] = {
            "id": message_id(upstream_id or self._request_id),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0},
        }
        return named_event(b"message_start", {"type": "message_start", "message": message})

    def _chunk(self, obj: dict[str, Any], out: list[bytes]) -> None:
        if obj.get("usage"):
            self._usage = obj["usage"]
        if "error" in obj and not obj.get("choices"):
            error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            out.append(self.error(str(error.get("message", "upstream error")), "upstream_error"))
            return
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            thinking = reasoning_of(delta)
            if thinking:
                self._open(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
            content = delta.get("content")
            if content:
                self._open(out, "text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": content}))
            for call in delta.get("tool_calls") or ():
                self._tool_call(call, out)
            if choice.get("finish_reason"):
                self._stop = STOP_REASONS.get(choice["finish_reason"], "end_turn")

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        position = call.get("index", 0)
        function = call.get("function") or {}
        if position not in self._tools:
            block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or tool_use_id(),
                     "name": function.get("name") or "", "input": {}}  # fmt: skip
            self._open(out, "tool_use", block, force=True)
            self._tools[position] = self._index
        arguments = function.get("arguments")
        if arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))

    def _open(self, out: list[bytes], kind: str, block: dict[str, Any], *, force: bool = False) -> None:
        if self._block == kind and not force:
            return
        self._close(out)
        self._index += 1
        self._block = kind
        event = {"type": "content_block_start", "index": self._index, "content_block": block}
        out.append(named_event(b"content_block_start", event))

    def _close(self, out: list[bytes]) -> None:
        if self._block is None:
            return
        if self._block == "thinking":  # the SDK's accumulated thinking block keeps a signature field
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(named_event(b"content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._block = None

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return named_event(b"content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                    "delta": delta})  # fmt: skip

    def _finish(self) -> bytes:
        out: list[bytes] = []
        self._close(out)
        usage = usage_of(self._usage)
        delta = {"type": "message_delta", "delta": {"stop_reason": self._stop or "end_turn",
                 "stop_sequence": None}, "usage": usage}  # fmt: skip
        out.append(named_event(b"message_delta", delta))
        out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        return b"".join(out)
