"""The request that asks a backend to go on with an answer another backend broke off: the client's
chat payload, shaped for the new backend, with the answer so far as a final assistant message in the
form that backend's engine continues (``resume`` on the backend: ``continue_final_message``, a
``partial`` message, or a plain prefill). The resumed stream (``request/resume.py``) sends it, and
``gateway check --live`` (``measure/live.py``) sends one to see whether a backend really continues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from gateway.backends.chat_shape import shaped, with_cache_salt

if TYPE_CHECKING:
    from gateway.policy.compiled import CompiledBackend


def continuation_body(
    payload: dict[str, Any],
    backend: CompiledBackend,
    answer: str,
    reasoning: str,
    max_tokens: int | None,
    generated: int,
    cache_salt: str | None = None,
) -> bytes:
    """The client's request, asking ``backend`` to go on from ``answer`` (or to start over without one),
    shaped as that backend takes it (``backends.chat_shape``); ``reasoning`` is the thinking that came
    before it."""
    payload = shaped(payload, backend)[0]
    body = dict(payload)
    body["model"] = backend.model
    with_cache_salt(body, cache_salt, backend)  # the continuation stays in the request's cache scope
    body["stream"] = True
    body["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    if max_tokens is not None:
        key = "max_completion_tokens" if "max_completion_tokens" in payload else "max_tokens"
        body[key] = max(1, max_tokens - generated)
    if answer:
        prefill: dict[str, Any] = {"role": "assistant", "content": answer}
        if backend.resume == "partial":
            prefill["partial"] = True
        if backend.resume == "continue_final_message":
            body["continue_final_message"] = True
            # vLLM and llama-server refuse continue_final_message with add_generation_prompt (it defaults
            # to true in both); SGLang has no such request field and would ignore it.
            if backend.dialect != "sglang":
                body["add_generation_prompt"] = False
            if backend.dialect == "vllm" and reasoning:
                # vLLM hands an assistant message's ``reasoning`` to the chat template, which renders it
                # as a closed think channel: its parser then reads the prompt's reasoning as ended and
                # streams what follows as content (renderers/chat_utils/chat_message.py:619-659,
                # parser/abstract_parser.py:869-881 in vLLM 0.33.0).
                prefill["reasoning"] = reasoning
            elif backend.dialect == "llamacpp" and reasoning:
                # llama-server renders it as a closed think block before the continued content
                # (common/chat-auto-parser-generator.cpp:45-61): the model sees its own thinking.
                prefill["reasoning_content"] = reasoning
        body["messages"] = [*payload["messages"], prefill]
    return orjson.dumps(body)
