"""Property tests (hypothesis) on what reads untrusted bytes: the SSE splitter gives the same events
however the network cuts the stream, and the request parser and the policy loader fail only with their
own errors (InvalidRequest / ModelNotFound, PolicyError), never with an unhandled exception."""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.doors.anthropic import MESSAGES
from gateway.doors.embeddings import EMBEDDINGS
from gateway.doors.openai import CHAT, COMPLETIONS
from gateway.doors.responses import RESPONSES
from gateway.errors import InvalidRequest
from gateway.measure.meter import StreamMeter
from gateway.policy.load import PolicyError, compile_policy_text
from gateway.values.observation import Attempt

# bench/reliability/fuzz.py runs these with more examples (GATEWAY_PROPERTY_EXAMPLES).
EXAMPLES = int(os.environ.get("GATEWAY_PROPERTY_EXAMPLES", "300"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- the SSE splitter ---------------------------------------------------------------------------------

texts = st.text(max_size=12)
content_frame = texts.map(lambda t: {"choices": [{"index": 0, "delta": {"content": t}}]})
reasoning_frame = texts.map(lambda t: {"choices": [{"index": 0, "delta": {"reasoning_content": t}}]})
usage_frame = st.integers(0, 10_000).map(
    lambda n: {"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": n, "total_tokens": 2 * n}}
)
error_frame = texts.map(lambda t: {"error": {"message": t}})
json_event = st.one_of(content_frame, reasoning_frame, usage_frame, error_frame).map(
    lambda obj: b"data: " + orjson.dumps(obj)
)
# Not JSON, not a separator: comments, other fields, junk bytes (a corrupt event among them).
junk_event = st.binary(min_size=1, max_size=30).filter(
    lambda b: b"\n\n" not in b and b"\r" not in b and not b.endswith(b"\n")
)
other_event = st.sampled_from([b": keep-alive", b"event: message\ndata: {}", b"data: [DONE]"])


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    crlf = draw(st.booleans())
    first = draw(json_event)  # a stream's first event is a real one; junk may follow
    rest = draw(st.lists(st.one_of(json_event, json_event, other_event, junk_event), max_size=15))
    sep = b"\r\n\r\n" if crlf else b"\n\n"
    events = [first, *rest]
    if crlf:
        events = [e.replace(b"\n", b"\r\n") for e in events]
    stream = b"".join(e + sep for e in events) + draw(st.binary(max_size=8).filter(lambda b: b"\n" not in b))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=12)))
    return stream, cuts


def feed_all(pieces: list[bytes], wants_usage: bool) -> tuple[bytes, tuple[Any, ...]]:
    meter = StreamMeter(Attempt("b", 0.0), client_wants_usage=wants_usage, prompt_tokens=7)
    out = b""
    for piece in pieces:
        out += meter.feed(piece, 1.0)
        if meter.corrupt or meter.upstream_error is not None:  # where the relay stops reading (a
            break  # corrupt event or the upstream's error event ends the stream)
    state = (meter.answer_chunks, meter.reasoning_chunks, meter.usage_obj, meter.done, meter.corrupt)
    return out, state


@PROPERTY
@given(sse_streams(), st.booleans())
def test_feeding_in_any_cuts_equals_feeding_whole(
    stream_and_cuts: tuple[bytes, list[int]], wants: bool
) -> None:
    stream, cuts = stream_and_cuts
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert b"".join(pieces) == stream
    assert feed_all(pieces, wants) == feed_all([stream], wants)


# --- the request parser --------------------------------------------------------------------------------

POLICY = compile_policy_text(
    """
backends:
  pool: {dialect: vllm, url: "http://127.0.0.1:9/v1", model: m, pricing: {gpu_hours: {usd_per_hour: 1}}}
routes:
  kimi-k3: {backends: [pool]}
""",
    "policy.yaml",
    environ={},
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
KEYS = ["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens"]
request_like = st.fixed_dictionaries(
    {},
    optional={
        k: st.one_of(json_values, st.just("kimi-k3"), st.just([{"role": "user", "content": "x"}]))
        for k in KEYS
    },
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(orjson.dumps),
    request_like.map(orjson.dumps),
    st.integers(0, 60).map(lambda depth: b"[" * depth * 20 + b"]" * depth * 20),  # deep nesting
    st.integers(0, 400).map(  # numbers past any integer type: max_tokens in the billions and beyond
        lambda digits: (
            b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1'
            + b"0" * digits
            + b"}"
        )
    ),
)


@PROPERTY
@given(bodies)
def test_the_request_parser_raises_only_invalid_request(body: bytes) -> None:
    for door in (CHAT, COMPLETIONS):
        try:
            request = door.parse(body, POLICY, 4.0)
        except InvalidRequest:  # ModelNotFound is one
            continue
        assert request.route.name == "kimi-k3"
        assert request.max_tokens is None or request.max_tokens >= 1
        assert request.prompt_tokens >= 0 and math.isfinite(request.prompt_tokens)


# --- the other doors' parsers: hostile shapes where each door looks inside --------------------------------


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` three times in four: hostile values deep inside need valid ones around them."""
    return st.one_of(valid, valid, valid, other)


finite = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
text_like = mostly(st.text(max_size=10), finite)
anthropic_block = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking"]), finite)},
    optional={k: text_like for k in ("text", "source", "input", "content", "name", "id", "tool_use_id")},
)
anthropic_message = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "assistant"]), finite)},
    optional={"content": mostly(st.lists(mostly(anthropic_block, finite), max_size=4), text_like)},
)
input_part = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["input_text", "output_text", "input_image"]), finite)},
    optional={"text": text_like, "image_url": text_like},
)
response_item = st.fixed_dictionaries(
    {},
    optional={
        "type": mostly(
            st.sampled_from(["message", "function_call", "function_call_output", "reasoning"]), finite
        ),
        "role": mostly(st.sampled_from(["user", "assistant", "system", "developer"]), finite),
        "content": mostly(st.lists(mostly(input_part, finite), max_size=3), text_like),
        **{k: text_like for k in ("output", "name", "arguments", "call_id")},
    },
)
tools = st.lists(
    mostly(
        st.fixed_dictionaries(
            {"type": mostly(st.just("function"), finite)},
            optional={k: text_like for k in ("name", "description", "input_schema", "parameters")},
        ),
        finite,
    ),
    max_size=3,
)
# Each door's required fields are mostly valid, so that the parser gets past them to where it looks inside.
positive = st.integers(1, 2**70)
door_required = {
    MESSAGES: {
        "max_tokens": positive,
        "messages": st.lists(anthropic_message, min_size=1, max_size=4),
    },
    RESPONSES: {
        "input": st.one_of(st.text(min_size=1, max_size=10), st.lists(response_item, min_size=1, max_size=4)),
    },
    EMBEDDINGS: {
        "input": st.one_of(
            st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=5),
            st.lists(st.text(), min_size=1, max_size=3),
            st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3), min_size=1, max_size=3),
        ),
    },
}
door_optional = {
    MESSAGES: {
        "system": mostly(st.lists(mostly(anthropic_block, finite), max_size=3), text_like),
        "stream": st.booleans(),
        "tools": mostly(tools, finite),
        "tool_choice": mostly(
            st.fixed_dictionaries({"type": text_like}, optional={"name": text_like}), finite
        ),
        "metadata": mostly(st.fixed_dictionaries({}, optional={"user_id": text_like}), finite),
        "stop_sequences": finite,
        "temperature": finite,
    },
    RESPONSES: {
        "instructions": text_like,
        "stream": st.booleans(),
        "max_output_tokens": mostly(positive, finite),
        "store": finite,
        "tools": mostly(tools, finite),
        "tool_choice": mostly(
            st.fixed_dictionaries({"type": text_like}, optional={"name": text_like}), finite
        ),
        "previous_response_id": finite,
        "temperature": finite,
    },
    EMBEDDINGS: {"stream": finite, "encoding_format": finite},
}


@st.composite
def door_bodies(draw: st.DrawFn) -> tuple[Any, bytes]:
    door = draw(st.sampled_from(list(door_required)))
    base = {"model": st.just("kimi-k3"), **door_required[door]}
    fields = draw(st.fixed_dictionaries(base, optional=door_optional[door]))
    if draw(st.integers(0, 9)) == 0:  # and now and then one required field is anything at all
        fields[draw(st.sampled_from(sorted(base)))] = draw(json_values)
    return door, json.dumps(fields).encode()  # the stdlib writes integers of any size


@PROPERTY
@given(door_bodies())
def test_every_doors_parser_raises_only_invalid_request(door_and_body: tuple[Any, bytes]) -> None:
    """What a door accepts it can send upstream: the payload it builds is JSON orjson can write."""
    door, body = door_and_body
    try:
        request = door.parse(body, POLICY, 4.0)
    except InvalidRequest:
        return
    orjson.dumps(request.payload)
    assert request.max_tokens is None or request.max_tokens >= 1
    assert request.prompt_tokens >= 0 and math.isfinite(request.prompt_tokens)


# Bytes no JSON parser should take, and what they must meet: a 400, on every door.
HOSTILE_BODIES = [
    b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "' + b"\xff\xfe" + b'"}]}',  # not UTF-8
    b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
    b'{"model": "kimi-k3", "max_tokens": 1e400, "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "kimi-k3", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deeper than any parser goes
    b'{"model": "kimi-k3\\u0000", "messages": []}',
    b"\xef\xbb\xbf{}",  # a byte-order mark
]


@given(st.sampled_from(HOSTILE_BODIES), st.sampled_from([CHAT, COMPLETIONS, MESSAGES, RESPONSES, EMBEDDINGS]))
@settings(deadline=None)
def test_hostile_bytes_meet_a_400_on_every_door(body: bytes, door: Any) -> None:
    try:
        door.parse(body, POLICY, 4.0)
    except InvalidRequest:
        return
    raise AssertionError(f"{door.name} accepted {body[:80]!r}")


# --- the policy loader ------------------------------------------------------------------------------

VALID = yaml.safe_load(
    """
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {gpu_hours: {usd_per_hour: 62.93, accounting: marginal}}
    timeouts: {first_byte_s: 5, idle_s: 2}
  paid:
    dialect: openai
    url: https://api.example.com/v1
    model: k
    pricing: {per_token: {input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}
routes:
  kimi-k3:
    backends: [pool, paid]
    slo: {ttft_p95_ms: 3000}
    fallback: {max_attempts: 2}
    budgets: {per_day_usd: 10}
auth:
  keys: [{name: app, sha256: "0000000000000000000000000000000000000000000000000000000000000000"}]
"""
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += paths(value, (*prefix, i))
    return found


def replaced(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = replaced(copy[path[0]], path[1:], value)
    return copy


@st.composite
def mutated_policies(draw: st.DrawFn) -> str:
    path = draw(st.sampled_from(paths(VALID)))
    value = draw(st.one_of(json_values, st.floats(), st.just(float("inf")), st.integers(-(2**70), 2**70)))
    return yaml.safe_dump(replaced(VALID, path, value))


@PROPERTY
@given(st.one_of(st.text(max_size=300), mutated_policies()))
def test_the_policy_loader_raises_only_policy_error(text: str) -> None:
    with contextlib.suppress(PolicyError):  # anything else fails the test
        compile_policy_text(text, "policy.yaml", environ={})


# Deep nesting is a plain test, not a drawn example: a RecursionError under hypothesis's tracing is slow
# and may land in hypothesis's own frames. ruamel recurses per level: ~250 levels exhaust the stack.
@pytest.mark.parametrize("depth", [100, 300, 1000, 5000])
@pytest.mark.parametrize("brackets", ["[]", "{}"])
def test_a_policy_nested_deeper_than_the_stack_is_a_policy_error(depth: int, brackets: str) -> None:
    opening, closing = brackets[0], brackets[1]
    inner = "a: " if opening == "{" else ""
    text = "backends: " + (opening + inner) * depth + "1" * (opening == "{") + closing * depth
    with contextlib.suppress(PolicyError):
        compile_policy_text(text, "policy.yaml", environ={})


@pytest.mark.parametrize("content", [True, 7, "text", {"type": "reasoning_text"}])
def test_a_reasoning_item_whose_content_is_no_array_is_a_400(content: Any) -> None:
    """Found by the property above: a reasoning item's ``content`` of True was iterated (a 500)."""
    body = {
        "model": "kimi-k3",
        "input": [{"type": "reasoning", "content": content}, {"role": "user", "content": "hi"}],
    }
    with pytest.raises(InvalidRequest, match="reasoning item"):
        RESPONSES.parse(json.dumps(body).encode(), POLICY, 4.0)
