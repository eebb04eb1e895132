"""Wire shapes of the emulated dialects: stream frames, full responses, usage, errors, health, models.

Sources: vLLM's chat_completion/serving.py and llama.cpp's tools/server/server-task.cpp; see each class.
SGLang's lives in ``sglang.py``; ``dialect_choice.py`` names each profile's.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import ClassVar

import orjson

from gateway.doors.anthropic_errors import error_body
from gateway.emulator.profiles import DialectName, Profile
from gateway.emulator.turn import Json, Timings, Turn


def openai_error(status: int, message: str) -> Json:
    if status == 429:
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    elif status >= 500:
        kind, code = "server_error", None
    else:
        kind, code = "invalid_request_error", {401: "invalid_api_key", 404: "model_not_found"}.get(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _delta_choice(delta: Json, finish_reason: str | None = None) -> Json:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _text_choice(text: str, finish_reason: str | None = None) -> Json:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


class OpenAIDialect:
    """An OpenAI-compatible paid API (the Kimi K3 vendor endpoint and its rivals).

    Reasoning in ``delta.reasoning_content``; with ``include_usage`` every chunk carries ``usage: null`` and
    a last ``choices: []`` chunk the usage, with cached-prompt and reasoning token details.
    """

    name: ClassVar[DialectName] = "openai"
    fingerprint: ClassVar[str | None] = "fp_emulated"

    def reasoning_field(self, turn: Turn) -> str:
        return "reasoning_content"

    def envelope(self, turn: Turn, *, stream: bool) -> Json:
        chat_object = "chat.completion.chunk" if stream else "chat.completion"
        obj = chat_object if turn.endpoint == "chat" else "text_completion"
        envelope: Json = {"id": turn.id, "object": obj, "created": turn.created, "model": turn.model}
        if self.fingerprint is not None:
            envelope["system_fingerprint"] = self.fingerprint
        return envelope

    def chunk(self, turn: Turn, choices: list[Json]) -> Json:
        frame = self.envelope(turn, stream=True)
        frame["choices"] = choices
        if turn.include_usage and not turn.omit_stream_usage:
            frame["usage"] = None  # OpenAI marks every chunk but the last when usage was asked for
        return frame

    def token_choice(self, turn: Turn, index: int, finish_reason: str | None = None) -> Json:
        if turn.endpoint == "completions":
            return _text_choice(turn.text(index), finish_reason)
        if turn.tool_name is not None and not turn.is_reasoning(index):
            return _delta_choice(turn.tool_delta(index), finish_reason)
        field = self.reasoning_field(turn) if turn.is_reasoning(index) else "content"
        return _delta_choice({field: turn.text(index)}, finish_reason)

    def finish_choice(self, turn: Turn) -> Json:
        if turn.endpoint == "completions":
            return _text_choice("", turn.finish_reason)
        return _delta_choice({}, turn.finish_reason)

    def usage(self, turn: Turn, completion_tokens: int, *, final: bool = True) -> Json:
        usage: Json = {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": turn.prompt_tokens + completion_tokens,
        }
        if turn.endpoint == "chat":
            usage["prompt_tokens_details"] = {"cached_tokens": turn.cached_tokens}
            reasoning = min(completion_tokens, turn.reasoning_tokens)
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return usage

    def usage_chunk(self, turn: Turn) -> Json:
        frame = self.envelope(turn, stream=True)
        frame["choices"] = []
        frame["usage"] = self.usage(turn, turn.total_tokens)
        return frame

    # -- streams: head frames go out with the first token, tail frames after the last --------------

    def head(self, turn: Turn) -> list[Json]:
        if turn.endpoint == "completions":
            return []
        return [self.chunk(turn, [_delta_choice({"role": "assistant", "content": ""})])]

    def token(self, turn: Turn, index: int) -> Json:
        return self.chunk(turn, [self.token_choice(turn, index)])

    def tail(self, turn: Turn, timings: Timings) -> list[Json]:
        frames = [self.chunk(turn, [self.finish_choice(turn)])]
        if turn.include_usage and not turn.omit_stream_usage:
            frames.append(self.usage_chunk(turn))
        return frames

    # -- full responses ------------------------------------------------------------------------------

    def message(self, turn: Turn) -> Json:
        reasoning = turn.joined(0, turn.reasoning_tokens)
        content = turn.joined(turn.reasoning_tokens, turn.total_tokens)
        message: Json = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning or None,
            "refusal": None,
        }
        if turn.tool_name is not None:
            message.update(content=None, tool_calls=turn.tool_calls())
        return message

    def response(self, turn: Turn, timings: Timings) -> Json:
        body = self.envelope(turn, stream=False)
        if turn.endpoint == "chat":
            choice = {"index": 0, "message": self.message(turn), "logprobs": None}
            body["choices"] = [{**choice, "finish_reason": turn.finish_reason}]
        else:
            body["choices"] = [_text_choice(turn.joined(0, turn.total_tokens), turn.finish_reason)]
        body["usage"] = self.usage(turn, turn.total_tokens)
        return body

    # -- everything else -----------------------------------------------------------------------------

    def error(self, status: int, message: str) -> Json:
        return openai_error(status, message)

    def context_error(self, prompt_tokens: int, context: int, *, stream: bool) -> Json:
        message = (
            f"This model's maximum context length is {context} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages."
        )
        return {"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                          "code": "context_length_exceeded"}}  # fmt: skip

    def health(self, ready: bool) -> tuple[int, Json | None]:
        return (200, {"status": "ok"}) if ready else (503, self.error(503, "The server is starting up."))

    def models(self, profile: Profile, created: int) -> Json:
        model = {"id": profile.model, "object": "model", "created": created, "owned_by": profile.owned_by}
        return {"object": "list", "data": [model]}


class VllmDialect(OpenAIDialect):
    """vLLM's OpenAI server with a reasoning parser (Kimi K3 thinks on every request).

    As chat_completion/serving.py: a role chunk with empty content at the first token, ``finish_reason`` on
    the last token's own chunk, a ``choices: []`` usage chunk only with ``include_usage``, cumulative usage
    on every chunk with continuous usage stats; errors ``{"error": {"message", "type", "param", "code"}}``.
    """

    name: ClassVar[DialectName] = "vllm"
    fingerprint: ClassVar[str | None] = None

    def reasoning_field(self, turn: Turn) -> str:
        return turn.reasoning_field

    def chunk(self, turn: Turn, choices: list[Json], emitted: int = 0) -> Json:
        frame = self.envelope(turn, stream=True)
        frame["choices"] = choices
        if turn.continuous_usage:
            frame["usage"] = self.usage(turn, emitted, final=False)
        return frame

    def usage(self, turn: Turn, completion_tokens: int, *, final: bool = True) -> Json:
        usage: Json = {
            "prompt_tokens": turn.prompt_tokens,
            "total_tokens": turn.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if turn.endpoint == "chat":
            reasoning = min(completion_tokens, turn.reasoning_tokens)
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
            if final:  # vLLM adds prompt details only to the final usage, and only with its flag
                details = {"cached_tokens": turn.cached_tokens} if turn.report_cached else None
                usage["prompt_tokens_details"] = details
        return usage

    def token_choice(self, turn: Turn, index: int, finish_reason: str | None = None) -> Json:
        return {**super().token_choice(turn, index, finish_reason), "stop_reason": None}

    def token(self, turn: Turn, index: int) -> Json:
        last = index == turn.total_tokens - 1
        choice = self.token_choice(turn, index, turn.finish_reason if last else None)
        if turn.endpoint == "chat" and not last:
            del choice["stop_reason"]  # vLLM sets stop_reason only on the finishing chunk
        return self.chunk(turn, [choice], emitted=index + 1)

    def tail(self, turn: Turn, timings: Timings) -> list[Json]:
        frames: list[Json] = []
        if turn.total_tokens == 0:  # nothing carried the finish_reason yet
            choice = self.finish_choice(turn)
            if turn.endpoint == "chat":
                choice["delta"] = {"content": ""}
            frames.append(self.chunk(turn, [choice]))
        if (turn.include_usage or turn.continuous_usage) and not turn.omit_stream_usage:
            frames.append(self.usage_chunk(turn))
        return frames

    def message(self, turn: Turn) -> Json:
        reasoning = turn.joined(0, turn.reasoning_tokens) or None
        content = turn.joined(turn.reasoning_tokens, turn.total_tokens) or None
        return {"role": "assistant", "content": content, "refusal": None, "annotations": None, "audio": None,
                "function_call": None, "tool_calls": [], turn.reasoning_field: reasoning,
                **({"content": None, "tool_calls": turn.tool_calls()} if turn.tool_name else {})}  # fmt: skip

    def response(self, turn: Turn, timings: Timings) -> Json:
        body = super().response(turn, timings)
        body["choices"][0]["stop_reason"] = None
        body.update(service_tier=None, system_fingerprint=None, prompt_logprobs=None, kv_transfer_params=None)
        return body

    def error(self, status: int, message: str) -> Json:
        names = {
            400: "BadRequestError",
            404: "NotFoundError",
            500: "InternalServerError",
            501: "NotImplementedError",
        }
        try:
            fallback = HTTPStatus(status).phrase.replace(" ", "") + "Error"
        except ValueError:
            fallback = "Error"
        return {
            "error": {"message": message, "type": names.get(status, fallback), "param": None, "code": status}
        }

    def context_error(self, prompt_tokens: int, context: int, *, stream: bool) -> Json:
        message = (
            f"This model's maximum context length is {context} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt."
        )
        return {
            "error": {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
        }

    def health(self, ready: bool) -> tuple[int, Json | None]:
        return (200, None) if ready else (503, None)

    def models(self, profile: Profile, created: int) -> Json:
        permission = {"id": "modelperm-emulated", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}  # fmt: skip
        model = {"id": profile.model, "object": "model", "created": created, "owned_by": "vllm",
                 "root": profile.model, "parent": None, "max_model_len": profile.context_tokens,
                 "permission": [permission]}  # fmt: skip
        return {"object": "list", "data": [model]}


class LlamaCppDialect(OpenAIDialect):
    """llama.cpp's ``llama-server`` with a reasoning format that splits thinking into reasoning_content.

    As tools/server/server-task.cpp: a role chunk with null content at the first token, a separate finish
    chunk with an empty delta, a usage chunk only with ``include_usage`` (the completions endpoint's final
    chunk always has usage), ``timings`` on the last chunk; errors ``{"error": {"code", "message", "type"}}``.
    """

    name: ClassVar[DialectName] = "llamacpp"
    fingerprint: ClassVar[str | None] = "b7000-emulated"

    def chunk(self, turn: Turn, choices: list[Json]) -> Json:
        return {**self.envelope(turn, stream=True), "choices": choices}

    def usage(self, turn: Turn, completion_tokens: int, *, final: bool = True) -> Json:
        # No reasoning count, but the prompt tokens served from the slot's cache (usage_json_oaicompat).
        return {
            "completion_tokens": completion_tokens,
            "prompt_tokens": turn.prompt_tokens,
            "total_tokens": turn.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cached_tokens},
        }

    def token_choice(self, turn: Turn, index: int, finish_reason: str | None = None) -> Json:
        if turn.endpoint == "completions":
            return _text_choice(turn.text(index), finish_reason)
        if turn.tool_name is not None and not turn.is_reasoning(index):
            return {"finish_reason": finish_reason, "index": 0, "delta": turn.tool_delta(index)}
        field = "reasoning_content" if turn.is_reasoning(index) else "content"
        return {"finish_reason": finish_reason, "index": 0, "delta": {field: turn.text(index)}}

    def head(self, turn: Turn) -> list[Json]:
        if turn.endpoint == "completions":
            return []
        return [
            self.chunk(
                turn, [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}]
            )
        ]

    def tail(self, turn: Turn, timings: Timings) -> list[Json]:
        usage_wanted = not turn.omit_stream_usage and (turn.include_usage or turn.endpoint == "completions")
        if turn.endpoint == "completions":
            final = self.chunk(turn, [self.finish_choice(turn)])
            if usage_wanted:  # the completions endpoint's final chunk always carries usage
                final["usage"] = self.usage(turn, turn.total_tokens)
            frames = [final]
        else:
            finish = {"finish_reason": turn.finish_reason, "index": 0, "delta": {}}
            frames = [self.chunk(turn, [finish])]
            if usage_wanted:
                frames.append(self.usage_chunk(turn))
        frames[-1]["timings"] = timings.to_json()
        return frames

    def message(self, turn: Turn) -> Json:
        message: Json = {
            "role": "assistant",
            "content": turn.joined(turn.reasoning_tokens, turn.total_tokens),
        }
        if turn.reasoning_tokens:
            message["reasoning_content"] = turn.joined(0, turn.reasoning_tokens)
        if turn.tool_name is not None:
            message.update(content=None, tool_calls=turn.tool_calls())
        return message

    def response(self, turn: Turn, timings: Timings) -> Json:
        body = self.envelope(turn, stream=False)
        if turn.endpoint == "chat":
            body["choices"] = [
                {"finish_reason": turn.finish_reason, "index": 0, "message": self.message(turn)}
            ]
        else:
            body["choices"] = [_text_choice(turn.joined(0, turn.total_tokens), turn.finish_reason)]
        body["usage"] = self.usage(turn, turn.total_tokens)
        body["timings"] = timings.to_json()
        return body

    def error(self, status: int, message: str) -> Json:
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}  # fmt: skip
        return {"error": {"code": status, "message": message, "type": kinds.get(status, "server_error")}}

    def context_error(self, prompt_tokens: int, context: int, *, stream: bool) -> Json:
        message = (
            f"request ({prompt_tokens} tokens) exceeds the available context size ({context} tokens), "
            "try increasing it"
        )
        return {"error": {"code": 400, "message": message, "type": "exceed_context_size_error",
                          "n_prompt_tokens": prompt_tokens, "n_ctx": context}}  # fmt: skip

    def health(self, ready: bool) -> tuple[int, Json | None]:
        return (200, {"status": "ok"}) if ready else (503, self.error(503, "Loading model"))

    def models(self, profile: Profile, created: int) -> Json:
        listed = {
            "name": profile.model,
            "model": profile.model,
            "type": "model",
            "capabilities": ["completion"],
        }
        meta = {"n_ctx_train": profile.context_tokens, "n_params": 2_800_000_000_000}
        model = {
            "id": profile.model,
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "meta": meta,
        }
        return {"models": [listed], "object": "list", "data": [model]}


class AnthropicDialect(OpenAIDialect):
    """Chat turns as the OpenAI dialect builds them; only errors have Anthropic's own shape here."""

    name: ClassVar[DialectName] = "anthropic"

    def error(self, status: int, message: str) -> Json:
        parsed: Json = orjson.loads(error_body(status, message))
        return parsed
