"""A stream cut when its pool dies goes on from a backend that can continue it, as the gateway's
``request/resume.py`` continues it: the cut attempt charged for what it made, the rest of the answer
generated (and paid) on the API after a prompt that ends with the answer so far; without a candidate
that can continue, the stream fails as ``upstream_dropped``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import load_policy
from gateway.simulate.workload import Fault, SimRequest
from tests.simulate.tiny import run, tiny_policy

# The pool's one seat: first token at 1 s, then 100 tokens/s; it dies at 6 s, 501 tokens in.
DIES_AT = 6.0
MADE = 501


def policy(tmp_path: Path, api_resume: str) -> CompiledPolicy:
    tiny_policy(tmp_path)
    path = tmp_path / "tiny.yaml"
    text = path.read_text().replace(
        "    dialect: openai\n", f"    dialect: openai\n    resume: {api_resume}\n"
    )
    path.write_text(text)
    return load_policy(path)


def cut(reasoning: int) -> SimRequest:
    return SimRequest(0.0, "r", 10, 1001, reasoning, None, True)


def dies() -> tuple[Fault, ...]:
    return (Fault(backend="pool", kind="down", start_s=DIES_AT, end_s=600.0),)


def test_a_stream_cut_after_its_thinking_continues_on_the_api(tmp_path: Path) -> None:
    result = run(policy(tmp_path, "partial"), [cut(reasoning=0)], faults=dies())
    [outcome] = result.outcomes
    assert outcome.ok and outcome.error is None
    assert outcome.attempts == 2 and outcome.backend == "api"
    assert outcome.ttft_s == pytest.approx(1.0)  # the client's first token came from the pool
    assert outcome.output_tokens == 1001  # 501 from the pool, the rest of the answer from the API
    continued = 1001 - MADE
    assert result.api_usd["api"] == pytest.approx(continued * 15e-6)
    pool_share = MADE / 100 * 36 / 3600  # the pool's seconds for those tokens, at $36/h
    assert outcome.cost_usd == pytest.approx(continued * 15e-6 + pool_share, rel=0.05)


def test_a_stream_cut_while_thinking_restarts_on_the_api(tmp_path: Path) -> None:
    result = run(policy(tmp_path, "partial"), [cut(reasoning=800)], faults=dies())
    [outcome] = result.outcomes
    assert outcome.ok and outcome.attempts == 2
    # The thinking starts over: the API makes the whole answer again.
    assert result.api_usd["api"] == pytest.approx(1001 * 15e-6)
    assert outcome.output_tokens == MADE + 1001


def test_a_stream_with_no_backend_to_continue_it_fails(tmp_path: Path) -> None:
    result = run(policy(tmp_path, "none"), [cut(reasoning=0)], faults=dies())
    [outcome] = result.outcomes
    assert not outcome.ok and outcome.error == "upstream_dropped"
    assert result.api_usd["api"] == 0.0
