"""What the client has been sent of one chat stream (``Transcript``), kept by the meter as it passes, so
that a backend taking over a cut stream (``gateway.request.resume``) can go on from there."""

from __future__ import annotations

from typing import Any


class Transcript:
    """What the client has been sent of one chat stream, for a backend that takes it over."""

    __slots__ = ("answer", "created", "model", "reasoning", "resumable", "stream_id", "takeovers")

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self.created: Any = None
        self.model: Any = None
        self.answer: list[str] = []
        self.reasoning: list[str] = []
        self.resumable = True  # tool calls in flight cannot be continued as text
        self.takeovers: list[dict[str, Any]] = []  # each resume, for the client's last chunk

    def started(self, event: dict[str, Any]) -> None:
        self.stream_id = event.get("id")
        self.created = event.get("created")
        self.model = event.get("model")

    def answered(self, content: Any, tool_calls: Any) -> None:
        if tool_calls:
            self.resumable = False
        elif isinstance(content, str):
            self.answer.append(content)

    def reasoned(self, text: Any) -> None:
        if isinstance(text, str):
            self.reasoning.append(text)
