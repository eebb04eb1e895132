"""The switches an emulated engine reads from its environment at start, as the engine itself does."""

from __future__ import annotations

from collections.abc import Mapping

GENERATION_SWITCH = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def health_generation_enabled(environ: Mapping[str, str]) -> bool:
    """The switch as sglang/srt/environ.py:144-150 parses it (EnvBool, default true)."""
    value = environ.get(GENERATION_SWITCH, "").strip().lower()
    return value not in ("false", "0", "no", "n")
