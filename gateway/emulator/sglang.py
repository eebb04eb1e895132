"""SGLang's OpenAI-compatible server as the ``sglang`` emulator profile speaks it (python/sglang/srt/
entrypoints/openai/serving_chat.py): reasoning in ``reasoning_content`` (with ``--reasoning-parser``),
``matched_stop`` on finishing choices, usage without a reasoning count, models owned by "sglang"."""

from __future__ import annotations

from http import HTTPStatus
from typing import ClassVar

from gateway.emulator.dialects import OpenAIDialect
from gateway.emulator.profiles import DialectName, Profile
from gateway.emulator.turn import Json, Timings, Turn


class SglangDialect(OpenAIDialect):
    name: ClassVar[DialectName] = "sglang"
    fingerprint: ClassVar[str | None] = None

    def usage(self, turn: Turn, completion_tokens: int, *, final: bool = True) -> Json:
        # usage_processor.py: cached tokens only with --enable-cache-report; a top-level reasoning count,
        # and the OpenAI place for it only when there is some.
        reasoning = min(completion_tokens, turn.reasoning_tokens) if turn.endpoint == "chat" else 0
        return {
            "prompt_tokens": turn.prompt_tokens,
            "total_tokens": turn.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cached_tokens} if turn.report_cached else None,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }

    def error(self, status: int, message: str) -> Json:
        # A flat ErrorResponse, not nested under "error", typed with the status phrase as the request
        # validation handler does (http_server.py:635-693, serving_base.py:205-221).
        return {"object": "error", "message": message, "type": HTTPStatus(status).phrase, "param": None,
                "code": status}  # fmt: skip

    def context_error(self, prompt_tokens: int, context: int, *, stream: bool) -> Json:
        message = f"The input ({prompt_tokens} tokens) is longer than the model's context length"
        message += f" ({context} tokens)."
        # serving_chat.py:2428 answers a stream's validation error with the default type; handle_request
        # (serving_base.py:123-128) a non-streamed one with "BadRequest".
        kind = "BadRequestError" if stream else "BadRequest"
        return {"object": "error", "message": message, "type": kind, "param": None, "code": 400}

    def finish_choice(self, turn: Turn) -> Json:
        return {**super().finish_choice(turn), "matched_stop": None}

    def response(self, turn: Turn, timings: Timings) -> Json:
        body = super().response(turn, timings)
        body["choices"][0]["matched_stop"] = None
        return body

    def health(self, ready: bool) -> tuple[int, Json | None]:
        return (200, None) if ready else (503, None)  # http_server.py:735-736, 784: empty bodies

    def models(self, profile: Profile, created: int) -> Json:
        model = {"id": profile.model, "object": "model", "created": created, "owned_by": "sglang",
                 "root": profile.model, "max_model_len": profile.context_tokens}  # fmt: skip
        return {"object": "list", "data": [model]}
