"""The prefix index: keys from a conversation as it grows, lookups by TTL and capacity, learning the
TTL from reported cached tokens, and keys that other processes compute alike."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from gateway.measure.prefix_index import (
    FIRST_BOUNDARIES,
    LAST_BOUNDARIES,
    PrefixIndex,
    PromptKeys,
    prompt_keys,
)

SYSTEM = "You are a coding agent. " * 200  # ~1,200 tokens every conversation shares


def conversation(seed: int, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"session {seed} turn {turn}: " + "read the file. " * 400}
        )
        messages.append({"role": "assistant", "content": f"answer {seed}.{turn} " + "done. " * 300})
    return messages


def keys_of(messages: list[dict[str, Any]], client_key: str | None = None) -> PromptKeys:
    chars = sum(len(m["content"]) for m in messages)
    return prompt_keys({"messages": messages}, chars, 4.0, client_key)


def index(ttl_s: float = 300.0, capacity: int = 10_000_000) -> PrefixIndex:
    return PrefixIndex(lambda name: ttl_s, lambda name: capacity)


def test_keys_are_bounded_increasing_and_end_at_the_prompt() -> None:
    messages = conversation(1, 30)
    keys = keys_of(messages)
    assert len(keys.hashes) == len(keys.ends) == FIRST_BOUNDARIES + LAST_BOUNDARIES
    assert list(keys.ends) == sorted(keys.ends)
    chars = sum(len(m["content"]) for m in messages)
    assert keys.ends[-1] == -(-chars // 4)


def test_the_next_turn_finds_the_whole_previous_prompt() -> None:
    idx = index()
    before = conversation(1, 5)
    idx.record("b300-a", keys_of(before), now=0.0)
    after = [*before, {"role": "user", "content": "and now the tests " * 50}]
    expected = idx.expected_cached("b300-a", keys_of(after), now=10.0)
    assert expected == keys_of(before).ends[-1]
    assert idx.expected_cached("b300-b", keys_of(after), now=10.0) == 0


def test_another_conversation_shares_only_the_system_prompt() -> None:
    idx = index()
    idx.record("b300-a", keys_of(conversation(1, 5)), now=0.0)
    other = keys_of(conversation(2, 5))
    assert idx.expected_cached("b300-a", other, now=1.0) == other.ends[0]  # the system prompt only


def test_a_changed_message_breaks_the_match_from_there_on() -> None:
    """A client that shortens an earlier message (a tool result cut down) changes every later prefix."""
    idx = index()
    messages = conversation(1, 5)
    idx.record("api", keys_of(messages), now=0.0)
    edited = [dict(m) for m in messages]
    edited[-2]["content"] = edited[-2]["content"][:100]
    keys = keys_of(edited)
    assert idx.expected_cached("api", keys, now=1.0) == keys.ends[-3]


def test_entries_age_out_after_the_ttl() -> None:
    idx = index(ttl_s=300.0)
    keys = keys_of(conversation(1, 3))
    idx.record("api", keys, now=0.0)
    assert idx.expected_cached("api", keys, now=299.0) == keys.ends[-1]
    assert idx.expected_cached("api", keys, now=301.0) == 0


def test_capacity_evicts_the_least_recently_used_conversation_first() -> None:
    one, two = keys_of(conversation(1, 6)), keys_of(conversation(2, 6))
    idx = index(capacity=one.ends[-1] + two.ends[-1] // 2)
    idx.record("b300", one, now=0.0)
    idx.record("b300", two, now=1.0)
    assert idx.expected_cached("b300", two, now=2.0) == two.ends[-1]
    assert idx.expected_cached("b300", one, now=2.0) < one.ends[-1]


def test_entries_stay_bounded_over_many_sessions() -> None:
    idx = PrefixIndex(lambda name: 1e9, lambda name: 10**12, max_entries=1000)
    for seed in range(500):
        idx.record("api", keys_of(conversation(seed, 4)), now=float(seed))
    assert idx.report()["api"]["entries"] <= 1000


def test_a_client_key_finds_a_conversation_that_moved_past_the_last_boundaries() -> None:
    idx = index()
    before = conversation(1, 3)
    idx.record("api", keys_of(before, "session-1"), now=0.0)
    after = before + conversation(9, LAST_BOUNDARIES)[1:]  # many messages at once
    assert idx.expected_cached("api", keys_of(after), now=1.0) == keys_of(before).ends[1]  # first turn
    assert idx.expected_cached("api", keys_of(after, "session-1"), now=1.0) == keys_of(before).ends[-1]


def test_misses_reported_on_predicted_hits_shorten_the_ttl() -> None:
    idx = index(ttl_s=300.0)
    for turn in range(1, 8):
        keys = keys_of(conversation(1, turn))
        idx.record("api", keys, now=turn * 60.0, reported_cached=0 if turn > 1 else None)
    assert idx.report()["api"]["ttl_s"] < 200.0


def test_hits_reported_after_the_ttl_lengthen_it() -> None:
    idx = index(ttl_s=60.0)
    for turn in range(1, 8):
        before = keys_of(conversation(1, turn - 1)) if turn > 1 else None
        keys = keys_of(conversation(1, turn))
        reported = None if before is None else before.ends[-1]
        idx.record("api", keys, now=turn * 200.0, reported_cached=reported)
    assert idx.report()["api"]["ttl_s"] > 120.0


def test_keys_are_the_same_in_another_process() -> None:
    """Replicas share keys through the store: no per-process salt may enter them (str hashes do)."""
    code = (
        "from tests.unit.test_prefix_index import keys_of, conversation;"
        "print(keys_of(conversation(3, 4)).hashes)"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        ).stdout
        for env in (_env("1"), _env("2"))
    }
    assert runs == {f"{keys_of(conversation(3, 4)).hashes}\n"}


def _env(seed: str) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONHASHSEED": seed}


def test_a_completions_prompt_has_one_key() -> None:
    keys = prompt_keys({"prompt": "hello " * 100}, 600, 4.0)
    assert keys.ends == (150,) and len(keys.hashes) == 1
