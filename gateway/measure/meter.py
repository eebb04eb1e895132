"""The stream meter: splits an upstream's SSE bytes into events and measures each once, on the way
through: first reasoning and first answer times, chunk counts, usage, the end of the stream, and what
breaks it: an event no client could read, or the upstream's own error event (``failure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import AttemptFailure, scrubbed
from gateway.values.dialect import REASONING_FIELDS, counted_usage, usage_from
from gateway.values.observation import Attempt, Usage

if TYPE_CHECKING:
    from gateway.measure.transcript import Transcript


CORRUPT = "the stream carried an event that is not JSON (or longer than any event is)"
MAX_EVENT_BYTES = 4 * 1024 * 1024  # one SSE event; a longer one is a corrupt stream, not held forever
REJOIN_BYTES = 4096  # an unfinished event up to this long is rejoined and rescanned whole on each read


class StreamMeter:
    """Splits a byte stream into SSE events, notes first-token times, counts chunks, keeps usage."""

    __slots__ = (
        "_attempt",
        "_client_wants_usage",
        "_held",
        "_prompt_tokens",
        "_sep",
        "_tail",
        "answer_chunks",
        "continues_answer",
        "corrupt",
        "done",
        "final_usage",
        "reasoning_chunks",
        "transcript",
        "upstream_error",
        "usage_obj",
    )

    def __init__(
        self,
        attempt: Attempt,
        *,
        client_wants_usage: bool,
        prompt_tokens: int,
        transcript: Transcript | None = None,
        continues_answer: bool = False,
    ) -> None:
        self._attempt = attempt
        # Continuing an answer another backend began: whatever it sends is answer, in whichever field.
        self.continues_answer = continues_answer
        # What the client has been sent, kept only where a cut stream may be resumed elsewhere.
        self.transcript = transcript
        self._client_wants_usage = client_wants_usage
        self._prompt_tokens = prompt_tokens  # the gateway's estimate, for usage nobody reported
        self._sep = b""
        self._tail: list[bytes] = []  # an unfinished event, in the pieces it came in
        self._held = 0  # its length
        self.answer_chunks = 0
        self.reasoning_chunks = 0
        self.usage_obj: Any = None
        self.done = False
        self.corrupt = False  # an event no client can read came by: the stream is broken there
        self.final_usage = False  # the usage-only chunk for the client went by: it gets the cost
        self.upstream_error: Any = None  # the upstream's error event: the stream failed there

    def saw_done(self) -> bool:
        """Whether ``data: [DONE]`` went by: the stream is complete for the client."""
        return self.done

    def feed(self, data: bytes, now: float) -> bytes:
        """Take bytes from the network; return the complete events to forward now. An unfinished
        event waits in pieces, and only new bytes are searched for its end: a long event costs
        linear time, and one past MAX_EVENT_BYTES makes the stream corrupt."""
        if self._held:
            # A short unfinished event (the usual one: an event cut by a read) is simply joined and
            # searched again; only a long one is searched piecewise, where rescanning would cost.
            if self._held > REJOIN_BYTES and not self._ends_in(b"".join(self._tail[-3:])[-3:] + data):
                self._hold(data)
                return b""
            buf = b"".join(self._tail) + data
            self._tail, self._held = [], 0
        else:
            buf = data
        if not self._sep:
            # sse-starlette (llama-cpp-python) ends lines with CRLF, vLLM and llama-server with LF. Told
            # apart by the first event's end: a CR elsewhere (in garbage) must not make LF events one.
            if b"\n\n" in buf:
                self._sep = b"\n\n"
            elif b"\r\n\r\n" in buf:
                self._sep = b"\r\n\r\n"
            else:
                self._hold(buf)
                return b""
        sep = self._sep
        cut = buf.rfind(sep)
        if cut < 0:
            self._hold(buf)
            return b""
        cut += len(sep)
        complete = buf[:cut]
        if cut < len(buf):
            self._hold(buf[cut:])
        events = complete.split(sep)
        events.pop()  # the empty remainder after the last separator
        dropped = False
        kept: list[bytes] = []
        for event in events:
            if self._inspect(event, now):
                kept.append(event)
            else:
                dropped = True
                if self.corrupt or self.upstream_error is not None:
                    # Nothing after it is forwarded (an engine's [DONE] after its error event included):
                    # the relay ends the stream here, or resumes it elsewhere.
                    self._tail, self._held = [], 0
                    break
        if not dropped:
            return complete
        return b"".join(event + sep for event in kept)

    def _ends_in(self, data: bytes) -> bool:
        if self._sep:
            return self._sep in data
        return b"\n\n" in data or b"\r\n\r\n" in data

    def _hold(self, data: bytes) -> None:
        self._tail.append(data)
        self._held += len(data)
        if self._held > MAX_EVENT_BYTES:  # no end in sight: a corrupt stream, and nothing kept of it
            self.corrupt = True
            self._tail, self._held = [], 0

    def _inspect(self, event: bytes, now: float) -> bool:
        """Measure one event; False means the client must not see it."""
        payload = _data_of(event)
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            # No OpenAI client can read it (the SDKs raise on it): a corrupt stream, not an event.
            self.corrupt = True
            return False
        if not isinstance(obj, dict):
            return True
        usage = obj.get("usage")
        if usage:
            self.usage_obj = usage  # cumulative when sent on every frame: keep the latest, never add
        transcript = self.transcript
        if transcript is not None and transcript.stream_id is None:
            transcript.started(obj)
        choices = obj.get("choices")
        if not choices:
            if "error" in obj:
                # vLLM and SGLang end a generation that failed with this event and then [DONE] (SGLang
                # with a usage chunk between): the answer is cut here, whatever follows, and the client
                # gets the resumed answer or the relay's error event, never a clean end.
                self.upstream_error = obj["error"]
                return False
            if usage and self._client_wants_usage:
                self.final_usage = True
                return True
            return not usage
        for choice in choices:
            self._inspect_choice(choice, now)
        return True

    def _inspect_choice(self, choice: Any, now: float) -> None:
        if not isinstance(choice, dict):
            return
        transcript = self.transcript
        if transcript is not None:
            if index := choice.get("index"):  # a second choice or later (n > 1)
                transcript = transcript.choice(index)
            if reason := choice.get("finish_reason"):
                transcript.finish_reason = reason
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if content or delta.get("tool_calls"):
                self._answer(now)
                if transcript is not None:
                    transcript.answered(content, delta.get("tool_calls"))
                return
            for field in REASONING_FIELDS:
                text = delta.get(field)
                if text and self.continues_answer:
                    self._answer(now)
                    if transcript is not None:
                        transcript.answered(text, None)
                    return
                if text:
                    self._reasoning(now)
                    if transcript is not None:
                        transcript.reasoned(text)
                    return
        elif text := choice.get("text"):  # /v1/completions
            self._answer(now)
            if transcript is not None:
                transcript.answered(text, None)

    def _answer(self, now: float) -> None:
        self.answer_chunks += 1
        attempt = self._attempt
        if attempt.first_answer_s is None:
            attempt.first_answer_s = now - attempt.started_at
            if attempt.ttft_s is None:
                attempt.ttft_s = attempt.first_answer_s

    def _reasoning(self, now: float) -> None:
        self.reasoning_chunks += 1
        if self._attempt.ttft_s is None:
            self._attempt.ttft_s = now - self._attempt.started_at

    def failure(self, backend: str) -> AttemptFailure | None:
        """What broke the stream, if something did: an event no client can read (``dropped``), or the
        upstream's error event (``upstream_error``, with the status it names, so that a 4xx is not counted
        against the backend's health), in words scrubbed of URLs, hosts, keys and tracebacks."""
        if self.corrupt:
            return AttemptFailure("dropped", f"{backend}: {CORRUPT}")
        error = self.upstream_error
        if error is None:
            return None
        said = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        status = code if type(code) is int and 400 <= code <= 599 else None
        message = f"{backend}: the upstream reported an error mid-stream: {scrubbed(str(said or ''))}"
        return AttemptFailure("upstream_error", message, http_status=status)

    def usage_so_far(self) -> Usage:
        """The upstream's usage figure when it gave one, else the gateway's count."""
        usage = usage_from(self.usage_obj, self.reasoning_chunks)
        if usage is None:
            chunks = self.answer_chunks + self.reasoning_chunks
            usage = counted_usage(self._prompt_tokens, chunks, self.reasoning_chunks)
        return usage

    def finish(self, now: float) -> None:
        """Settle the attempt's usage and end time."""
        attempt = self._attempt
        attempt.finished_at = now
        attempt.token_chunks = self.answer_chunks + self.reasoning_chunks
        attempt.usage = self.usage_so_far()


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data:"):
        line = event[5:]
        newline = line.find(b"\n")
        if newline >= 0:  # a multi-line event: only the data line matters
            line = line[:newline]
        return line.strip()
    for line in event.splitlines():
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None
