"""An agent workload: many coding-agent sessions at once, each resending its growing conversation.

A session is tens of turns. Every prompt starts with the same system prompt and tool definitions
(``shared_prefix_tokens``, common to all sessions), then the session's own messages: the task, then per
turn the assistant's reply and the tool results it asked for. A turn's prompt is the previous turn's
prompt plus one more message, so it grows from ~20k to ~300k tokens, and a backend that served the
previous turn holds all but the newest message in its prefix cache (if nothing evicted it).

Arrivals are open loop, fixed by the seed, so every router replays the same requests: the next turn
comes ``think`` seconds (tool runs, the user reading) after the previous answer would have ended at
``assumed_tokens_per_s``. Each request carries its ``PromptShape`` (message boundaries and chained
hashes) for the simulated caches and the gateway's prefix index.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.simulate.workload import (
    DEFAULT_START,
    BackendModel,
    Lengths,
    SimRequest,
    Workload,
    WorkloadError,
    parse_start,
)

Positive = Annotated[float, Field(gt=0)]
SHARED_PREFIX_HASH = 0x5EED_0F_A6E7  # the system prompt + tools message, the same in every session


class AgentsFile(BaseModel):
    """A workload file of agent sessions (``kind: agents``), parsed strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field("agents", pattern="^agents$")
    name: str = "agents"
    seed: int = 0
    route: str = "kimi-k3"
    sessions: int = Field(24, ge=1)
    start_window_s: Positive = 600.0  # sessions begin uniformly over this window
    duration_s: Positive = 1800.0  # the run; turns after it are dropped
    start: str = DEFAULT_START
    turns: Lengths = Lengths(median=24, sigma=0.3, min=10, max=40)
    shared_prefix_tokens: int = Field(16_000, ge=0)  # system prompt + tool definitions
    task_tokens: Lengths = Lengths(median=4_000, sigma=0.5, min=500, max=20_000)
    turn_tokens: Lengths = Lengths(median=9_000, sigma=0.7, min=500, max=60_000)  # reply + tool results
    max_prompt_tokens: int = Field(300_000, ge=1)  # a session ends before its prompt passes this
    output_tokens: Lengths = Lengths(median=1_200, sigma=0.6, min=50, max=8_000)
    thinking_share: float = Field(0.7, ge=0.0, le=1.0)
    think_s: Lengths = Lengths(median=20, sigma=0.6, min=2, max=240)
    assumed_tokens_per_s: Positive = 50.0  # to place the next turn after this one's answer
    backends: dict[str, BackendModel] = Field(default_factory=dict)
    # API keys the sessions are spread over (session i uses key i % keys), each its own cache scope
    # (``prefix_cache: {share: key}``, the default once a route serves two keys): no key's prompts,
    # the shared system prompt included, are found in another's cache. 0: one scope for all.
    keys: int = Field(0, ge=0)


def read_agents_file(path: str | Path) -> AgentsFile:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    source = Path(path)
    try:
        data = YAML(typ="safe").load(source.read_text())
    except (OSError, YAMLError) as exc:
        raise WorkloadError(f"{source}: cannot read the agent workload: {exc}") from None
    try:
        return AgentsFile.model_validate(data)
    except ValidationError as exc:
        problems = "\n".join(f"  {'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise WorkloadError(f"{source}: the agent workload does not validate:\n{problems}") from None


def agent_workload(spec: AgentsFile, backends: Mapping[str, Any] | None = None) -> Workload:
    """Every turn of every session, in arrival order; ``backends`` replaces the file's models."""
    rng = random.Random(spec.seed)
    requests: list[SimRequest] = []
    for session in range(spec.sessions):
        at = rng.uniform(0.0, spec.start_window_s)
        turns = spec.turns.draw(rng)
        ends: list[int] = []
        hashes: list[int] = []
        if spec.shared_prefix_tokens:
            ends.append(spec.shared_prefix_tokens)
            # Under per-key isolation the same system prompt is another prefix for each key, as an
            # engine given another cache_salt hashes its first block apart.
            hashes.append(
                hash((SHARED_PREFIX_HASH, session % spec.keys)) if spec.keys else SHARED_PREFIX_HASH
            )
        tokens = spec.shared_prefix_tokens
        for turn in range(turns):
            grow = (spec.task_tokens if turn == 0 else spec.turn_tokens).draw(rng)
            output = spec.output_tokens.draw(rng)
            think = spec.think_s.draw(rng)
            if tokens + grow > spec.max_prompt_tokens or at >= spec.duration_s:
                break
            tokens += grow
            ends.append(tokens)
            # Chained: a message's key stands for everything before it too (hash of ints: no salt).
            hashes.append(hash((hashes[-1] if hashes else 0, spec.seed, session, turn)))
            reasoning = round(output * spec.thinking_share)
            shape = (tuple(ends), tuple(hashes))
            requests.append(SimRequest(at, spec.route, tokens, output, reasoning, None, True, session, shape))
            at += 2.0 + output / spec.assumed_tokens_per_s + think
    requests.sort(key=lambda r: (r.at, r.session))
    return Workload(
        spec.name,
        requests,
        spec.duration_s,
        parse_start(spec.start),
        dict(spec.backends if backends is None else backends),
        (),
        spec.seed,
    )
