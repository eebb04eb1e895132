"""The Responses door's stream translator: OpenAI chat chunks in, Responses API events out.

response.created and response.in_progress with the first event; each output item (reasoning, message,
function_call) opened with output_item.added, filled with its deltas and closed with its done events;
response.completed (or .incomplete) with the whole Response and its usage at ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from gateway.doors.responses_answer import ResponsesState, finished, item_id, message_item, reasoning_item
from gateway.doors.responses_tools import call_item
from gateway.doors.sse import named_event, reasoning_of, upstream_objects


class ResponsesStream:
    __slots__ = ("_calls", "_chat_name", "_finish", "_item", "_output", "_seq", "_shell", "_started",
                 "_state", "_text", "_usage")  # fmt: skip

    def __init__(self, shell: dict[str, Any], state: ResponsesState | None = None) -> None:
        self._shell = shell
        self._state = ResponsesState() if state is None else state
        self._chat_name = ""  # the open call's function name as the upstream knows it
        self._started = False
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items
        self._item: dict[str, Any] | None = None  # the open item
        self._text: list[str] = []  # the open item's text so far
        self._calls: dict[int, int] = {}  # upstream tool_call index -> output index
        self._finish: Any = None
        self._usage: Any = None

    def translate(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for obj in upstream_objects(events):
            if not self._started:
                self._started = True
                out.append(self._event("response.created", response=self._shell))
                out.append(self._event("response.in_progress", response=self._shell))
            if obj == "[DONE]":
                self._close(out)
                done = finished(self._shell, self._output, self._finish, self._usage)
                kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
                out.append(self._event(kind, response=done))
            elif isinstance(obj, dict):
                self._chunk(obj, out)
        return b"".join(out)

    def error(self, message: str, code: str) -> bytes:
        self._seq += 1
        event = {
            "type": "error",
            "code": code,
            "message": message,
            "param": None,
            "sequence_number": self._seq,
        }
        return named_event(b"error", event)

    def _chunk(self, obj: dict[str, Any], out: list[bytes]) -> None:
        if obj.get("usage"):
            self._usage = obj["usage"]
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = reasoning_of(delta)
            if reasoning:
                self._open(out, "reasoning", lambda: reasoning_item(item_id("rs"), "", "in_progress"))
                out.append(self._delta("response.reasoning_text.delta", reasoning, content_index=0))
            content = delta.get("content")
            if content:
                self._open(out, "message", lambda: message_item(item_id("msg"), "", "in_progress"))
                out.append(self._delta("response.output_text.delta", content, content_index=0, logprobs=[]))
            for call in delta.get("tool_calls") or ():
                self._tool_call(call, out)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        function = call.get("function") or {}
        if call.get("index", 0) not in self._calls:
            self._close(out)
            name, call_id = function.get("name") or "", call.get("id") or item_id("call")
            self._chat_name = name
            tools = self._state.tools
            self._open(out, "call", lambda: call_item(item_id("fc"), call_id, name, "", tools, "in_progress"))
            self._calls[call.get("index", 0)] = len(self._output)
        arguments = function.get("arguments")
        if arguments and self._item is not None:
            if self._item["type"] == "function_call":
                out.append(self._delta("response.function_call_arguments.delta", arguments))
            else:  # a custom tool's input is inside the JSON the model writes: sent whole at its end
                self._text.append(arguments)

    def _open(self, out: list[bytes], kind: str, make: Any) -> None:
        if self._item is not None and self._item["type"] == kind and kind != "call":
            return
        self._close(out)
        item = self._item = make()
        self._text = []
        index = len(self._output)
        out.append(self._event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))  # fmt: skip
        elif kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            out.append(self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part=part))  # fmt: skip

    def _close(self, out: list[bytes]) -> None:
        item, self._item = self._item, None
        if item is None:
            return
        text, index, kind = "".join(self._text), len(self._output), item["type"]
        where = {"item_id": item["id"], "output_index": index}
        if kind == "message":
            done = message_item(item["id"], text)
            out.append(
                self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            )
            out.append(
                self._event("response.content_part.done", **where, content_index=0, part=done["content"][0])
            )
        elif kind == "reasoning":
            done = reasoning_item(item["id"], text, sealer=self._state.sealer)
            out.append(self._event("response.reasoning_text.done", **where, content_index=0, text=text))
            out.append(
                self._event("response.content_part.done", **where, content_index=0, part=done["content"][0])
            )
        else:
            done = call_item(item["id"], item["call_id"], self._chat_name, text, self._state.tools)
            if kind == "function_call":
                out.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                       arguments=text))  # fmt: skip
            else:
                out.append(self._event("response.custom_tool_call_input.done", **where, input=done["input"]))
        out.append(self._event("response.output_item.done", output_index=index, item=done))
        self._output.append(done)

    def _delta(self, kind: str, text: str, **fields: Any) -> bytes:
        assert self._item is not None
        self._text.append(text)
        return self._event(
            kind, item_id=self._item["id"], output_index=len(self._output), delta=text, **fields
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return named_event(kind.encode(), {"type": kind, "sequence_number": self._seq, **fields})
