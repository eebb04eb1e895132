"""What the emulator reads from a completion request body: prompt text and size, output limit, stream options.

As lenient as the servers it imitates, and strict where they are (``stream_options`` without ``stream``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from gateway.emulator.prefix_cache import CHARS_PER_TOKEN

Endpoint = Literal["chat", "completions"]
# How a server lets a client continue an assistant message it started: vLLM with
# ``continue_final_message`` and ``add_generation_prompt: false``; SGLang with ``continue_final_message``
# alone (it has no ``add_generation_prompt`` field); llama-server as vLLM, or any trailing assistant
# message (its ``prefill_assistant``, on by default); Kimi's and DeepSeek's APIs with a final assistant
# message marked ``partial`` / ``prefix``.
ContinuationStyle = Literal["continue_final_message", "sglang", "llamacpp", "partial", "none"]
# Kimi K3's think-channel end marker (vLLM 0.33.0 reasoning/kimi_k3_reasoning_parser.py:101; SGLang's
# kimi_k3 detector): a continued prefix that holds it tells SGLang's reasoning parser that thinking is
# over (sglang/srt/parser/reasoning_parser.py:105-116 in 0.5.23).
THINK_CLOSE = "<|close|>think<|sep|>"


class BadRequest(ValueError):
    """The body is not a request this endpoint accepts; answered with a 400 in the dialect's shape."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    endpoint: Endpoint
    model: str | None
    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool
    continuation: str | None = None  # the assistant text this request asks to continue
    # Whether the engine's reasoning parser knows the continued text is past the thinking: if not, the
    # continued tokens come back in the reasoning field, as the real engines would send them.
    continuation_past_thinking: bool = True
    # A chat request offering tools whose last message is not a tool's result: the answer is a call to
    # the first tool (so clients can test a tool round trip); None otherwise.
    tool_name: str | None = None
    tool_argument: str = "query"  # the string argument the call fills: the tool's first required one
    # vLLM's and SGLang's ``cache_salt``: the prompt's cached blocks are found only under the same salt.
    cache_salt: str | None = None


def _cache_salt(body: dict[str, Any], strict: bool) -> str | None:
    """A non-empty string, or absent; ``strict``: as vLLM checks it too (docs/contracts/vllm.yaml,
    prefix_cache.salt), at most 128 characters and none of '@', '/', '\\', NUL."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
    if strict and salt is not None and (len(salt) > 128 or any(c in "@/\\\0" for c in salt)):
        raise BadRequest(
            "Parameter 'cache_salt' must be at most 128 characters and must "
            "not contain '@', '/', '\\\\', or NUL."
        )
    return salt


def _continuation(body: dict[str, Any], style: ContinuationStyle) -> str | None:
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if style == "none" or not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    asked = body.get("continue_final_message") not in (None, False)
    if style in ("continue_final_message", "llamacpp") and asked:
        if body.get("add_generation_prompt", True) is not False:
            raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    elif style == "sglang":
        if body.get("continue_final_message") is not True:
            return None
    elif style == "partial":
        if last.get("partial") is not True and last.get("prefix") is not True:
            return None
    elif style != "llamacpp":  # llama-server continues any trailing assistant message unasked
        return None
    content = last.get("content")
    return content if isinstance(content, str) else ""


def _past_thinking(body: dict[str, Any], style: ContinuationStyle) -> bool:
    """Whether a continued message's tokens come back as answer. vLLM: when the rendered prompt's newest
    think marker closes the channel, as the chat template renders an assistant message that carries its
    ``reasoning`` (vLLM 0.33.0 parser/abstract_parser.py:869-881, renderers/chat_utils/chat_message.py:
    619-659). SGLang: only when the prefix holds the think-end marker (reasoning_parser.py:105-116; the
    prefix is the message's content alone, serving_chat.py:515-548). llama-server: as asked
    ("content" / "reasoning_content"); ``true`` resolves to content unless the message has reasoning_content
    and no content (common/chat.cpp:622-636, 1262-1269)."""
    last = body["messages"][-1]
    content = last.get("content")
    closed = isinstance(content, str) and THINK_CLOSE in content
    if style == "continue_final_message":
        reasoning = last.get("reasoning")
        return closed or (isinstance(reasoning, str) and bool(reasoning))
    if style == "sglang":
        return closed
    if style == "llamacpp":
        asked = body.get("continue_final_message")
        if asked in ("content", "reasoning_content"):
            return bool(asked == "content")
        return bool(content) or not last.get("reasoning_content")
    return True


def parse_completion_request(
    body: Any,
    endpoint: Endpoint,
    *,
    strict_stream_options: bool,
    continuation_style: ContinuationStyle = "none",
    strict_cache_salt: bool = False,
) -> CompletionRequest:
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    if endpoint == "chat":
        text = _messages_text(body.get("messages"))
        prompt_tokens = math.ceil(len(text) / CHARS_PER_TOKEN)
    else:
        text, prompt_tokens = _prompt_text(body.get("prompt"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean.")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object.")
    if options and not stream and strict_stream_options:
        raise BadRequest("Stream options can only be defined when `stream=True`.")
    options = options or {}
    model = body.get("model")
    continuation = _continuation(body, continuation_style) if endpoint == "chat" else None
    return CompletionRequest(
        endpoint=endpoint,
        model=model if isinstance(model, str) else None,
        prompt_text=text,
        prompt_tokens=prompt_tokens,
        max_tokens=_max_tokens(body, endpoint),
        stream=bool(stream),
        include_usage=bool(stream) and options.get("include_usage") is True,
        continuous_usage_stats=bool(stream) and options.get("continuous_usage_stats") is True,
        continuation=continuation,
        continuation_past_thinking=continuation is None or _past_thinking(body, continuation_style),
        cache_salt=_cache_salt(body, strict_cache_salt),
        **(_tool_to_call(body) if endpoint == "chat" else {}),
    )


def _tool_to_call(body: dict[str, Any]) -> dict[str, str]:
    """``tool_name`` and ``tool_argument`` of the call to answer with, if any. The argument is the
    tool's first required string parameter, so an agent that runs the call (Codex's ``exec_command``
    takes ``cmd``) gets arguments it accepts."""
    tools, messages = body.get("tools"), body.get("messages")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return {}
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "tool":
        return {}
    function = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        return {}
    parameters = function.get("parameters") if isinstance(function, dict) else None
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    required = parameters.get("required") if isinstance(parameters, dict) else None
    if isinstance(required, list) and isinstance(properties, dict):
        for argument in required:
            spec = properties.get(argument)
            if isinstance(spec, dict) and spec.get("type") == "string":
                return {"tool_name": name, "tool_argument": argument}
    return {"tool_name": name}


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array.")
    parts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'.")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        elif content is not None:
            raise BadRequest(f"messages[{i}].content must be a string or an array of content parts.")
    return "".join(parts)


def _prompt_text(prompt: Any) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, math.ceil(len(prompt) / CHARS_PER_TOKEN)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        text = "".join(prompt)
        return text, math.ceil(len(text) / CHARS_PER_TOKEN)
    if isinstance(prompt, list) and prompt and all(type(p) is int for p in prompt):
        return " ".join(map(str, prompt)), len(prompt)  # token ids: one token each
    raise BadRequest("'prompt' is required: a string, an array of strings or an array of token ids.")


def _max_tokens(body: dict[str, Any], endpoint: Endpoint) -> int | None:
    names = ("max_completion_tokens", "max_tokens") if endpoint == "chat" else ("max_tokens",)
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise BadRequest(f"'{name}' must be a positive integer.")
        return value
    return None
