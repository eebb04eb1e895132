"""How each emulated engine ends a stream whose generation fails after it began (the ``error_after_chunks``
fault): the error event it sends, and what follows it on the wire.

As the engines' sources say (versions pinned in the contract files):
- vLLM 0.33.0: the raw chat stream yields the ``ErrorResponse`` of a ``GenerationError`` (code 500, type
  ``InternalServerError``; entrypoints/openai/chat_completion/serving.py:947-953, exceptions.py:131-136),
  and the wrapper writes it as a ``data:`` event and then ``data: [DONE]`` (serving.py:495-507).
- SGLang 0.5.23: an abort carrying an HTTP status becomes ``{"error": {"object": "error", "message",
  "type": <status name>, "param": null, "code": <status>}}`` (entrypoints/openai/serving_chat.py:2568-2578,
  serving_base.py:223-237); the loop breaks, the usage chunk still goes out when usage was asked for
  (serving_chat.py:2771-2793), then ``data: [DONE]`` (serving_chat.py:2805).
- llama-server (llama.cpp vendored by llama-cpp-python 0.3.36): ``data: {"error": {"code", "message",
  "type"}}`` and the stream ends there, no ``[DONE]`` (tools/server/server-context.cpp:4470-4474 with
  format_error at 4396-4405; server-common.cpp:36-66).
- A paid OpenAI-compatible API: an error event and the end of the stream.
"""

from __future__ import annotations

import orjson

from gateway.emulator.turn import Json

DONE = b"data: [DONE]\n\n"


def _event(frame: Json) -> bytes:
    return b"data: " + orjson.dumps(frame) + b"\n\n"


def stream_error_tail(dialect: str, usage_chunk: Json | None) -> list[bytes]:
    """The events that end a stream of ``dialect`` whose generation failed, in the engine's order;
    ``usage_chunk`` (what was generated until then) when the client asked for usage."""
    if dialect == "vllm":
        error = {
            "message": "Internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
        return [_event({"error": error}), DONE]
    if dialect == "sglang":
        error = {
            "object": "error",
            "message": "Generation aborted.",
            "type": "INTERNAL_SERVER_ERROR",
            "param": None,
            "code": 500,
        }
        usage = [] if usage_chunk is None else [_event(usage_chunk)]
        return [_event({"error": error}), *usage, DONE]
    if dialect == "llamacpp":
        error = {"code": 500, "message": "Generation failed.", "type": "server_error"}
        return [_event({"error": error})]
    message = "The server had an error while processing your request."
    return [_event({"error": {"message": message, "type": "server_error", "param": None, "code": None}})]
