"""Reading what upstreams say, in every OpenAI-compatible dialect we front: usage shapes, reasoning fields.

vLLM reports reasoning as ``reasoning`` (newer) or ``reasoning_content`` (older) and may omit the
reasoning count; llama.cpp never counts reasoning and may send no stream usage at all; paid APIs put
reasoning inside ``completion_tokens``. Everything here normalises to ``observation.Usage``.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from gateway.values.observation import Usage

REASONING_FIELDS = ("reasoning", "reasoning_content")
CHARS_PER_TOKEN = 4.0  # the usual rough ratio for English text (the policy's tuning.chars_per_token)


def usage_from(obj: Any, reasoning_chunks: int = 0) -> Usage | None:
    """Normalise an OpenAI-style ``usage`` object; ``None`` when it is absent or empty."""
    if not isinstance(obj, dict):
        return None
    completion = _int(obj.get("completion_tokens"))
    prompt = _int(obj.get("prompt_tokens"))
    if completion is None and prompt is None:
        return None
    completion = completion or 0
    details = obj.get("completion_tokens_details")
    reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    if reasoning is None:
        # The upstream did not count thinking (llama.cpp, some vLLM builds): the reasoning chunks seen
        # are the best figure, and they are already inside completion_tokens either way.
        reasoning = min(reasoning_chunks, completion)
    prompt_details = obj.get("prompt_tokens_details")
    cached = _int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
    return Usage(
        prompt_tokens=prompt or 0,
        completion_tokens=completion,
        reasoning_tokens=min(reasoning, completion),  # thinking is counted inside the completion
        cached_prompt_tokens=min(cached or 0, prompt or 0),
        source="reported",
        cached_reported=cached is not None,
    )


def unusable_answer(raw: bytes) -> str | None:
    """Why a 200 answer must not reach the client as one (so another backend is tried), or None: it is
    not JSON, or it is an OpenAI error body. A body with ``"choices"`` skips the parse."""
    if b'"choices"' in raw:
        return None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "answered 200 with a body that is not JSON"
    if not isinstance(parsed, dict):
        return "answered 200 with a body that is not a JSON object"
    if "error" in parsed:
        return "answered 200 with an error body"
    return None


def read_completion(
    raw: bytes, prompt_tokens: int, chars_per_token: float = CHARS_PER_TOKEN
) -> tuple[Usage, float | None]:
    """Usage of a non-streamed response, and its decode seconds when the upstream reports them
    (llama.cpp's ``timings.predicted_ms``); counted from the text when no usage came back
    (``prompt_tokens`` is then the gateway's own estimate)."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return counted_usage(prompt_tokens, 0, 0), None
    choices = parsed.get("choices")
    answer = reasoning = 0
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict):
            a, r = messagetext_chars(choice.get("message", choice))
            answer, reasoning = answer + a, reasoning + r
    reasoning_tokens = estimate_tokens(reasoning, chars_per_token)
    usage = usage_from(parsed.get("usage"), reasoning_tokens)
    if usage is None:
        usage = counted_usage(
            prompt_tokens, estimate_tokens(answer + reasoning, chars_per_token), reasoning_tokens
        )
    timings = parsed.get("timings")
    predicted_ms = timings.get("predicted_ms") if isinstance(timings, dict) else None
    decode_s = predicted_ms / 1000 if isinstance(predicted_ms, (int, float)) and predicted_ms >= 0 else None
    return usage, decode_s


def counted_usage(prompt_tokens: int, completion_chunks: int, reasoning_chunks: int) -> Usage:
    """Usage the gateway estimates when the upstream reported none: one token per streamed text chunk
    (vLLM and llama.cpp stream one token a frame) and its characters-per-token guess for the prompt."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_chunks,
        reasoning_tokens=reasoning_chunks,
        source="counted",
    )


def estimate_tokens(chars: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    return math.ceil(chars / chars_per_token) if chars > 0 else 0


def prompt_chars(payload: dict[str, Any]) -> int:
    """Characters of text in a chat ``messages`` list or a completions ``prompt``."""
    total = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                total += text_chars(message.get("content"))
    else:
        total += text_chars(payload.get("prompt"))
    return total


def messagetext_chars(message: Any) -> tuple[int, int]:
    """(answer chars, reasoning chars) of a non-streamed chat message or completion choice."""
    if not isinstance(message, dict):
        return 0, 0
    answer = text_chars(message.get("content", message.get("text")))
    reasoning = 0
    for field in REASONING_FIELDS:
        value = message.get(field)
        if isinstance(value, str):
            reasoning = max(reasoning, len(value))
    return answer, reasoning


def text_chars(content: Any) -> int:
    """Characters of a message's text (a string, or the text parts of a list): what the prompt's
    token estimate counts, and what the prefix index's boundaries add up to."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
        return total
    return 0


# No request holds 2^31 tokens (the ledger clamps there too): a count past it, or below 0, is an upstream
# lying or broken, and is clamped here, where usage enters, so the client's cost, the budgets, the rate
# limits and the ledger all charge the same figure and none is ever credited by a negative count.
TOKEN_LIMIT = 2**31 - 1


def _int(value: Any) -> int | None:
    """A token count as an upstream reported it, within [0, TOKEN_LIMIT]; None when it is no integer."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return min(max(value, 0), TOKEN_LIMIT)


def insert_usage_cost(body: bytes, cost_usd: float, basis: str | None, start: int = 0) -> bytes:
    """``body`` with ``cost`` (USD) and ``cost_basis`` added to its last ``usage`` object at or after
    ``start``, as OpenRouter reports a request's cost; the bytes are spliced, not re-encoded."""
    at = max(body.rfind(b'"usage":{', start), body.rfind(b'"usage": {', start))
    if at < 0:
        return body
    brace = body.index(b"{", at) + 1
    fields = b'"cost":' + orjson.dumps(round(cost_usd, 10)) + b',"cost_basis":' + orjson.dumps(basis or "")
    closing = body[brace : brace + 1] == b"}"
    return body[:brace] + fields + (b"" if closing else b",") + body[brace:]
