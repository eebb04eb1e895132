"""Fault knobs that tests and demos turn at run time (``/emulator/faults``), and the rate limiter.

Knobs are validated strictly: an unknown name or a value out of range is a 400, never silently ignored.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class FaultsError(ValueError):
    """A knob update that does not validate; the message lists every problem."""


class Faults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    error_rate: float = Field(0.0, ge=0.0, le=1.0)  # share of requests answered with error_status
    error_status: int = Field(500, ge=400, le=599)
    added_ttft_ms: float = Field(0.0, ge=0.0)  # emulated milliseconds before the first token
    hang: bool = False  # accept, then send nothing until the client leaves
    drop_after_chunks: int | None = Field(None, ge=0)  # abort the connection after N SSE frames
    # After N SSE frames the generation fails: the engine's error event and what it sends after one
    # (vLLM: [DONE]; SGLang: the usage chunk, [DONE]; llama-server: nothing), as ``stream_errors`` says.
    error_after_chunks: int | None = Field(None, ge=0)
    slowdown: float = Field(1.0, gt=0.0)  # divides the decode speed
    seats: int | None = Field(None, ge=1)  # fewer running seats than the profile: a queue forms sooner
    rate_limit_rpm: int | None = Field(None, ge=1)  # 429 past N requests per rolling emulated minute
    reasoning_tokens: int | None = Field(None, ge=0)  # override the profile's output lengths
    content_tokens: int | None = Field(None, ge=0)
    omit_stream_usage: bool = False  # never send usage in streams
    continuous_usage: bool = False  # vLLM: cumulative usage on every frame
    reasoning_field: Literal["reasoning", "reasoning_content"] = "reasoning"  # vLLM: newer or older name
    # Boot again, cold, for this many emulated seconds from now (health answers 503 meanwhile);
    # acted on once when set, then cleared.
    cold_boot_s: float | None = Field(None, gt=0.0)
    # The server dies now (``dying.py``): every request it holds is cut with no further byte, and for this
    # many emulated seconds nothing answers (0: it is back at once); acted on once when set, then cleared.
    dies_for_s: float | None = Field(None, ge=0.0)
    # vLLM's dead engine: /health answers 503 and every request 500 (docs/contracts/vllm.yaml, health.dead).
    engine_dead: bool = False

    def merged(self, patch: Any) -> Faults:
        if not isinstance(patch, dict):
            raise FaultsError("faults must be a JSON object")
        try:
            return Faults.model_validate({**self.model_dump(), **patch})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise FaultsError(problems) from exc


class RateLimiter:
    """Requests admitted in the last emulated minute; past the limit, how long until a place frees."""

    WINDOW_S = 60.0

    def __init__(self) -> None:
        self._admitted: deque[float] = deque()

    def retry_after_s(self, now: float, limit_rpm: int | None) -> float | None:
        """None admits the request (and counts it); otherwise the emulated seconds to wait."""
        if limit_rpm is None:
            self._admitted.clear()
            return None
        while self._admitted and self._admitted[0] <= now - self.WINDOW_S:
            self._admitted.popleft()
        if len(self._admitted) >= limit_rpm:
            oldest = self._admitted[len(self._admitted) - limit_rpm]
            return max(0.0, oldest + self.WINDOW_S - now)
        self._admitted.append(now)
        return None


def retry_after_headers(real_wait_s: float, limit_rpm: int) -> dict[str, str]:
    """OpenAI-style rate-limit headers: whole seconds in Retry-After, exact milliseconds beside it."""
    return {
        "retry-after": str(max(1, math.ceil(real_wait_s))),
        "retry-after-ms": str(max(1, math.ceil(real_wait_s * 1000))),
        "x-ratelimit-limit-requests": str(limit_rpm),
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": f"{real_wait_s:.3f}s",
    }
