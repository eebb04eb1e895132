"""The prefix index's keys tell prompts apart by their whole text, keep apart what another cache scope
sent, and come out the same when a conversation's next turn is carried from its previous one."""

from __future__ import annotations

from typing import Any

from gateway.measure.prefix_keys import KeyCarry, PromptKeys, prompt_keys

MEMO = (
    "You are the deal team's assistant. Confidential merger memo: Northwind will acquire Contoso for "
    "{price} in cash, announced on the 14th; until then nobody outside the deal team may know. "
) + "Background: the two companies have worked together for years. " * 80


def keys_of(messages: list[dict[str, Any]], **kw: Any) -> PromptKeys:
    chars = sum(len(m["content"]) for m in messages)
    return prompt_keys({"messages": messages}, chars, 4.0, **kw)


def conversation(system: str, turns: int, tag: str = "") -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}{tag}: " + "look at the figures. " * 60})
        messages.append({"role": "assistant", "content": f"answer {turn}{tag}: " + "the figures hold. " * 50})
    return messages


def test_prompts_of_the_same_shape_with_other_middles_get_other_keys() -> None:
    """The issue's memo: "$4.2B" or "$9.9B" in the middle of the system prompt, every length and both
    ends the same. Every key covers the system prompt, so none may match."""
    bob = conversation(MEMO.format(price="$4.2B"), 4)
    alice = conversation(MEMO.format(price="$9.9B"), 4)
    assert len(bob[0]["content"]) == len(alice[0]["content"])
    assert (
        bob[0]["content"][:32] == alice[0]["content"][:32]
        and bob[0]["content"][-32:] == alice[0]["content"][-32:]
    )
    one, two = keys_of(bob), keys_of(alice)
    assert one.ends == two.ends
    assert not set(one.hashes) & set(two.hashes)


def test_a_middle_message_of_the_same_length_changes_every_later_key() -> None:
    """A message between the first two and the last few (never sampled by the old keys) changed in its
    middle, same length: the keys up to before it agree, every one after it differs."""
    messages = conversation("system prompt. " * 100, 8)
    edited = [dict(m) for m in messages]
    text = edited[5]["content"]
    middle = len(text) // 2
    edited[5]["content"] = text[:middle] + "X" + text[middle + 1 :]
    one, two = keys_of(messages), keys_of(edited)
    assert one.ends == two.ends
    assert one.hashes[:2] == two.hashes[:2]  # the system prompt and the first turn are the same
    assert all(a != b for a, b in zip(one.hashes[2:], two.hashes[2:], strict=True))


def test_another_scope_never_shares_a_key() -> None:
    messages = conversation(MEMO.format(price="$4.2B"), 3)
    bob, alice, fleet = keys_of(messages, seed=11), keys_of(messages, seed=12), keys_of(messages)
    assert not set(bob.hashes) & set(alice.hashes)
    assert not set(bob.hashes) & set(fleet.hashes)
    assert keys_of(messages, seed=11) == bob


def test_role_and_tools_are_part_of_the_prefix() -> None:
    messages = conversation("system prompt. " * 100, 2)
    as_user = [dict(m) for m in messages]
    as_user[0]["role"] = "user"
    assert keys_of(messages).hashes[0] != keys_of(as_user).hashes[0]
    chars = sum(len(m["content"]) for m in messages)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    with_tools = prompt_keys({"messages": messages, "tools": tools}, chars, 4.0)
    assert with_tools.hashes[0] != keys_of(messages).hashes[0]


def test_a_carried_turn_has_the_keys_of_the_whole_prompt_hashed() -> None:
    """Turn after turn of one conversation, carried: each turn's keys are exactly those of hashing it
    whole, whether it added one message, two, or more than the last boundaries hold."""
    carry = KeyCarry()
    messages = conversation("system prompt. " * 100, 1)
    for added in (1, 2, 1, 7, 2, 0):
        messages = messages + conversation("", added, tag=f"+{len(messages)}")[1:]
        carried = keys_of(messages, client_key="session-1", seed=5, carry=carry)
        assert carried == keys_of(messages, client_key="session-1", seed=5)
    assert len(carry.entries) == 1


def test_a_rewritten_history_is_hashed_again_not_carried() -> None:
    """A client that shortens an earlier message under the same conversation key: the characters no
    longer add up, so the prompt is hashed whole and the changed prefix gets its own keys."""
    carry = KeyCarry()
    messages = conversation("system prompt. " * 100, 4)
    keys_of(messages, client_key="s", carry=carry)
    edited = [dict(m) for m in messages]
    edited[3]["content"] = edited[3]["content"][:100]
    edited.append({"role": "user", "content": "go on"})
    assert keys_of(edited, client_key="s", carry=carry) == keys_of(edited, client_key="s")


def test_the_carry_of_one_scope_is_not_another_scopes() -> None:
    carry = KeyCarry()
    messages = conversation("system prompt. " * 100, 3)
    keys_of(messages, client_key="shared-session-id", seed=1, carry=carry)
    other = [*messages, {"role": "user", "content": "next"}]
    whole = keys_of(other, client_key="shared-session-id", seed=2)
    assert keys_of(other, client_key="shared-session-id", seed=2, carry=carry) == whole
    assert len(carry.entries) == 2


def test_the_carry_is_bounded() -> None:
    carry = KeyCarry(max_entries=10)
    messages = conversation("system prompt. " * 100, 2)
    for session in range(50):
        keys_of(messages, client_key=f"s{session}", carry=carry)
    assert len(carry.entries) == 10
