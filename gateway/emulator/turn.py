"""What one response says about itself (``Turn``) and how long it took (``Timings``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.emulator.parsing import Endpoint

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """Everything one response says about itself, fixed when the request is accepted.

    Tokens are deterministic words, ``think<i> `` for reasoning then ``word<j> `` for the answer, so tests
    can check the text that went through.
    """

    endpoint: Endpoint
    id: str
    created: int
    model: str
    prompt_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    content_tokens: int
    finish_reason: str
    include_usage: bool  # the client asked for a usage chunk
    continuous_usage: bool  # vLLM: cumulative usage on every frame
    omit_stream_usage: bool
    reasoning_field: str  # vLLM: "reasoning" or "reasoning_content"
    report_cached: bool = True  # the engine's flag for cached-token reporting is on (or it needs none)
    content_offset: int = 0  # a continuation's answer words go on from here
    # A continuation whose engine's reasoning parser still thinks it is inside the think channel: the
    # answer words go out in the reasoning field (see parsing._past_thinking).
    answer_as_reasoning: bool = False
    tool_name: str | None = None  # the answer is a call to this tool (its arguments are the answer tokens)
    tool_argument: str = "query"  # the call's one argument, which holds the answer tokens

    @property
    def total_tokens(self) -> int:
        return self.reasoning_tokens + self.content_tokens

    def is_reasoning(self, index: int) -> bool:
        return self.endpoint == "chat" and (index < self.reasoning_tokens or self.answer_as_reasoning)

    def text(self, index: int) -> str:
        if index < self.reasoning_tokens:
            return f"think{index} "
        return f"word{index - self.reasoning_tokens + self.content_offset} "

    def joined(self, start: int, stop: int) -> str:
        return "".join(self.text(i) for i in range(start, stop))

    @property
    def call_id(self) -> str:
        return "call_" + self.id[-24:]

    def tool_delta(self, index: int) -> Json:
        """The ``tool_calls`` delta of answer token ``index``: the call's head with the first, then
        fragments of its JSON arguments ``{"query": "word0 word1 ..."}`` (or the tool's own argument)."""
        first, last = index == self.reasoning_tokens, index == self.total_tokens - 1
        fragment = (
            (f'{{"{self.tool_argument}": "' if first else "") + self.text(index) + ('"}' if last else "")
        )
        call: Json = {"index": 0, "function": {"arguments": fragment}}
        if first:
            call.update(id=self.call_id, type="function")
            call["function"] = {"name": self.tool_name, "arguments": fragment}
        return {"tool_calls": [call]}

    def tool_calls(self) -> list[Json]:
        arguments = (
            f'{{"{self.tool_argument}": "' + self.joined(self.reasoning_tokens, self.total_tokens) + '"}'
        )
        function = {"name": self.tool_name, "arguments": arguments}
        return [{"id": self.call_id, "type": "function", "function": function}]


@dataclass(frozen=True, slots=True)
class Timings:
    """llama.cpp's per-request timings, in real milliseconds."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float

    def to_json(self) -> Json:
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / self.predicted_n if self.predicted_n else 0.0,
            "predicted_per_second": 1e3 * self.predicted_n / self.predicted_ms
            if self.predicted_ms > 0
            else 0.0,
        }
