"""SGLang's OpenAI-compatible server as the ``sglang`` emulator profile speaks it (python/sglang/srt/
entrypoints/openai/serving_chat.py): reasoning in ``reasoning_content`` (with ``--reasoning-parser``),
``matched_stop`` on finishing choices, usage without a reasoning count, models owned by "sglang"."""

from __future__ import annotations

from typing import ClassVar

from gateway.emulator.dialects import OpenAIDialect
from gateway.emulator.profiles import DialectName, Profile
from gateway.emulator.turn import Json, Timings, Turn


class SglangDialect(OpenAIDialect):
    name: ClassVar[DialectName] = "sglang"
    fingerprint: ClassVar[str | None] = None

    def usage(self, turn: Turn, completion_tokens: int, *, final: bool = True) -> Json:
        return {
            "prompt_tokens": turn.prompt_tokens,
            "total_tokens": turn.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cached_tokens} if turn.cached_tokens else None,
        }

    def finish_choice(self, turn: Turn) -> Json:
        return {**super().finish_choice(turn), "matched_stop": None}

    def response(self, turn: Turn, timings: Timings) -> Json:
        body = super().response(turn, timings)
        body["choices"][0]["matched_stop"] = None
        return body

    def health(self, ready: bool) -> tuple[int, Json | None]:
        return (200, None) if ready else (503, None)

    def models(self, profile: Profile, created: int) -> Json:
        model = {"id": profile.model, "object": "model", "created": created, "owned_by": "sglang",
                 "root": profile.model, "max_model_len": profile.context_tokens}  # fmt: skip
        return {"object": "list", "data": [model]}
