"""What the client has been sent of one chat stream (``Transcript``), kept by the meter as it passes, so
that a backend taking over a cut stream (``gateway.request.resume``) can go on from there, and so that a
trace may hold the answer (``gateway.telemetry.content``)."""

from __future__ import annotations

from typing import Any

from gateway.telemetry.content import KEPT_STREAM_CHARS


class Transcript:
    """What the client has been sent of one chat stream, for a backend that takes it over; or, where the
    stream may not be resumed but its trace may hold the answer (``telemetry.content``), the answer's
    first ``keep_chars`` characters for the trace (``resumes`` False)."""

    __slots__ = (
        "_room",
        "answer",
        "calls",
        "created",
        "finish_reason",
        "model",
        "more",
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
        # The tool calls streamed, for the trace: [index, id, name, argument fragments] each.
        self.calls: list[list[Any]] = []
        self.reasoning: list[str] = []
        self.resumable = True  # tool calls in flight cannot be continued as text
        self.takeovers: list[dict[str, Any]] = []  # each resume, for the client's last chunk
        self.resumes = resumes  # False: kept for the trace alone, never resumed from
        # Characters of answer still kept; None: all of it (a resume needs it). In a box, shared by the
        # choices of one stream (``choice``) without their naming each other (no reference cycle).
        self._room: list[int | None] = [keep_chars]
        self.finish_reason: str | None = None  # the last one a chunk said, for the trace
        # A stream of several choices (``n``): the first choice is this one, each other one a
        # transcript of its own, for the trace only (kept from this one's room). Such a stream is
        # never resumed: a continuation goes on from one text, not several.
        self.more: dict[int, Transcript] | None = None

    def choice(self, index: Any) -> Transcript:
        """The transcript of the choice at ``index`` (``choices[].index``): this one for the first."""
        if not index or not isinstance(index, int):
            return self
        self.resumable = False
        more = self.more
        if more is None:
            more = self.more = {}
            if self._room[0] is None:  # kept whole for a resume that can no longer be: bounded now
                self._room[0] = KEPT_STREAM_CHARS - sum(map(len, self.answer))
        found = more.get(index)
        if found is None:
            found = more[index] = Transcript(resumes=False)
            found._room = self._room
        return found

    def started(self, event: dict[str, Any]) -> None:
        self.stream_id = event.get("id")
        self.created = event.get("created")
        self.model = event.get("model")

    def answered(self, content: Any, tool_calls: Any) -> None:
        if tool_calls:
            self.resumable = False
            if isinstance(tool_calls, list):
                self._called(tool_calls)
        if isinstance(content, str) and content:
            if self._room[0] is None:  # a stream that may be resumed: every chunk, no call more
                self.answer.append(content)
            elif kept := self._kept(content):
                self.answer.append(kept)

    def _kept(self, text: str) -> str:
        """As much of ``text`` as the room left holds (all of it where a resume needs it); the choices
        of one stream share the first one's room."""
        box = self._room
        room = box[0]
        if room is None:
            return text
        box[0] = room - len(text)
        return text[: max(room, 0)]

    def _called(self, deltas: list[Any]) -> None:
        # A call's first delta names it (index, id, function name); the ones after add to its arguments.
        for delta in deltas:
            if not isinstance(delta, dict):
                continue
            index = delta.get("index", 0)
            call = next((c for c in self.calls if c[0] == index), None)
            if call is None:
                call = [index, None, None, []]
                self.calls.append(call)
            call[1] = delta.get("id") or call[1]
            named = delta.get("function")
            function: dict[str, Any] = named if isinstance(named, dict) else {}
            call[2] = function.get("name") or call[2]
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments and (kept := self._kept(arguments)):
                call[3].append(kept)

    def reasoned(self, text: Any) -> None:
        if isinstance(text, str) and self.resumes:
            self.reasoning.append(text)
