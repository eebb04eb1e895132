"""What the client has been sent of one chat stream (``Transcript``), kept by the meter as it passes, so
that a backend taking over a cut stream (``gateway.request.resume``) can go on from there, and so that a
trace may hold the answer (``gateway.telemetry.content``)."""

from __future__ import annotations

from typing import Any


class Transcript:
    """What the client has been sent of one chat stream, for a backend that takes it over; or, where the
    stream may not be resumed but its trace may hold the answer (``telemetry.content``), the answer's
    first ``keep_chars`` characters for the trace (``resumes`` False)."""

    __slots__ = (
        "_room",
        "answer",
        "created",
        "finish_reason",
        "model",
        "reasoning",
        "resumable",
        "resumes",
        "stream_id",
        "takeovers",
    )

    def __init__(self, resumes: bool = True, keep_chars: int | None = None) -> None:
        self.stream_id: str | None = None
        self.created: Any = None
        self.model: Any = None
        self.answer: list[str] = []
        self.reasoning: list[str] = []
        self.resumable = True  # tool calls in flight cannot be continued as text
        self.takeovers: list[dict[str, Any]] = []  # each resume, for the client's last chunk
        self.resumes = resumes  # False: kept for the trace alone, never resumed from
        self._room = keep_chars  # characters of answer still kept; None: all of it (a resume needs it)
        self.finish_reason: str | None = None  # the last one a chunk said, for the trace

    def started(self, event: dict[str, Any]) -> None:
        self.stream_id = event.get("id")
        self.created = event.get("created")
        self.model = event.get("model")

    def answered(self, content: Any, tool_calls: Any) -> None:
        if tool_calls:
            self.resumable = False
        elif isinstance(content, str):
            room = self._room
            if room is None:
                self.answer.append(content)
            elif room > 0:
                self.answer.append(content[:room])
                self._room = room - len(content)

    def reasoned(self, text: Any) -> None:
        if isinstance(text, str) and self.resumes:
            self.reasoning.append(text)
