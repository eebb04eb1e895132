"""Which dialect class speaks for a profile: above every dialect module, so none of them imports another
but the base (``dialects.py``)."""

from __future__ import annotations

from gateway.emulator.dialects import AnthropicDialect, LlamaCppDialect, OpenAIDialect, VllmDialect
from gateway.emulator.profiles import DialectName
from gateway.emulator.sglang import SglangDialect


def dialect_for(name: DialectName) -> OpenAIDialect:
    dialects: dict[DialectName, type[OpenAIDialect]] = {
        "anthropic": AnthropicDialect,
        "sglang": SglangDialect,
        "vllm": VllmDialect,
        "llamacpp": LlamaCppDialect,
        "openai": OpenAIDialect,
    }
    return dialects[name]()
