"""What one request teaches: per-attempt timings and usage, gathered while bytes pass through.

One ``Observation`` per client request, one ``Attempt`` per upstream try. Stats, spend, the ledger
and metrics all read these objects and nothing else, so measuring happens in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

UsageSource = Literal["reported", "counted"]
AttemptStatus = Literal["ok", "upstream_error", "connect_error", "timeout", "dropped", "cancelled"]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0  # includes reasoning tokens, as OpenAI and vLLM report them
    reasoning_tokens: int = 0
    cached_prompt_tokens: int = 0
    # "reported": the upstream said so; "counted": the gateway estimated it (no usage came back).
    source: UsageSource = "reported"
    # The upstream said how many prompt tokens were cached (prompt_tokens_details.cached_tokens): an
    # engine without it (vLLM without --enable-prompt-tokens-details) says 0 without meaning it.
    cached_reported: bool = False


@dataclass(slots=True)
class Attempt:
    backend: str
    started_at: float  # clock seconds
    status: AttemptStatus = "ok"
    http_status: int | None = None
    error: str | None = None
    # Seconds from sending the request to the first token of any kind (reasoning or content).
    ttft_s: float | None = None
    # Seconds from sending the request to the first answer (content) token.
    first_answer_s: float | None = None
    finished_at: float | None = None
    # Seconds spent decoding, when known apart from the first-token wait: a non-streamed answer has no
    # first-token moment, so llama.cpp's own timing or an estimate from the backend's TTFT is used.
    decode_s: float | None = None
    # Text-bearing chunks seen; decode speed is measured over these.
    token_chunks: int = 0
    usage: Usage | None = None
    probe: bool = False  # a synthetic request of the gateway's own (gateway/probes.py), not a user's
    # A stream another backend broke off, taken over: "continued" (from the answer so far) or
    # "restarted" (cut while thinking: this backend thinks again).
    resumed: str | None = None
    # What this attempt cost, fixed once priced (when the client was told, or when it ended).
    cost_usd: float | None = None
    cost_basis: str | None = None
    prefill_cost_usd: float | None = None  # a pool's share of ``cost_usd`` for processing the prompt

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Output tokens after the first one, divided by the time they took to arrive."""
        if self.finished_at is None or self.usage is None:
            return None
        if self.decode_s is not None:
            decode_time = self.decode_s
        elif self.ttft_s is not None:
            decode_time = self.finished_at - self.started_at - self.ttft_s
        else:
            return None
        tokens = self.usage.completion_tokens - 1
        if tokens <= 0 or decode_time <= 0:
            return None
        return tokens / decode_time

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


@dataclass(slots=True)
class Observation:
    request_id: str
    route: str
    endpoint: str  # "chat" or "completions"
    stream: bool
    started_at: float
    prompt_chars: int = 0
    max_tokens: int | None = None
    api_key_name: str | None = None
    decision_reason: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    # cancelled: the client left first; refused: the gateway turned it away (its request, credentials
    # or limits) before any backend was tried.
    status: Literal["ok", "error", "cancelled", "refused"] = "ok"
    error_type: str | None = None
    finished_at: float | None = None
    cost_usd: float | None = None  # settled, summed over attempts
    cost_basis: str | None = None
    expected_cost_usd: float | None = None  # what the decision predicted for the chosen backend
    prefill_cost_usd: float | None = None  # the prompt-processing share of ``cost_usd`` (pools)
    queued_s: float = 0.0  # seconds spent waiting for a free or unpaused candidate
    user_hash: str | None = None  # keyed hash of the client's user id (ledger.user: hashed)
    # The prompt tokens the prefix index expected the answering backend to hold; None: not predicted.
    predicted_cached_tokens: int | None = None

    @property
    def final(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def backend(self) -> str | None:
        return self.attempts[-1].backend if self.attempts else None
