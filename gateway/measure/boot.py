"""What a health answer means over a backend's boot, per dialect (docs/contracts/*.yaml, section health).

The engines disagree: llama-server listens at once and answers 503 while it loads; vLLM and SGLang refuse
connections until the weights are loaded, and then vLLM's 503 means a dead engine while SGLang's means it is
still warming up. Reading every 503 as "booting" showed a dead vLLM as booting and a booting one as down.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import Fetched

# Dialects whose server refuses connections until the model is loaded, and whose 503 after that first
# healthy answer means the engine broke (vLLM: health.dead; SGLang: a failed health generation).
_REFUSE_WHILE_LOADING = frozenset({"vllm", "sglang"})


@dataclass(frozen=True, slots=True)
class HealthReading:
    healthy: bool
    booting: bool
    why: str  # for logs and `gateway check --live`: what the answer was read as


def refused(reply: Fetched) -> bool:
    """No HTTP answer because the connection itself failed (nothing listening, or a reset at connect)."""
    return reply.status is None and reply.error.startswith("ConnectError")


def read_health(
    dialect: str,
    reply: Fetched,
    *,
    ready_once: bool,
    waited_s: float,
    expected_boot_s: float | None,
) -> HealthReading:
    """Read one health answer. ``ready_once``: this backend has answered healthy since the gateway first
    looked; ``waited_s``: seconds since that first look; ``expected_boot_s``: the policy's bound on a boot."""
    if reply.status == 200:
        return HealthReading(True, False, "healthy")
    within_boot = not ready_once and (expected_boot_s is None or waited_s <= expected_boot_s)
    answer = f"HTTP {reply.status}" if reply.status is not None else reply.error or "no answer"
    if dialect in _REFUSE_WHILE_LOADING:
        if refused(reply) and within_boot:
            return HealthReading(False, True, "booting (connection refused while the model loads)")
        if reply.status == 503 and dialect == "sglang" and within_boot:
            return HealthReading(False, True, "booting (503 while the server warms up)")
        if reply.status == 503 and dialect == "vllm":
            return HealthReading(False, False, "down (HTTP 503: the engine is dead)")
        if not ready_once and not within_boot:
            return HealthReading(
                False, False, f"down (not up {expected_boot_s:g}s after the first look: {answer})"
            )
        return HealthReading(False, False, f"down ({answer})")
    # llama-server and the OpenAI-compatible rest: 503 is "loading" (llama.cpp health.loading_503).
    if reply.status == 503:
        return HealthReading(False, True, "booting (HTTP 503 while the model loads)")
    return HealthReading(False, False, f"down ({answer})")
