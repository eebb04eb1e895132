"""The Responses door through the official openai SDK's ``responses.create``, streaming and not, against
the gateway on the emulators; a request that needs stored state is refused with a clear 400."""

from __future__ import annotations

import math

import openai
import pytest

from tests.conftest import Gateway
from tests.doors.ledger import ANSWER, THINKING, ledger_row, settled_request_id

PROMPT = "Hello there, gateway."
TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def check_books(gateway: Gateway, usage: openai.types.responses.ResponseUsage, prompt_chars: int) -> None:
    row = ledger_row(gateway, settled_request_id(gateway, 1))
    assert usage.input_tokens == row["prompt_tokens"] == math.ceil(prompt_chars / 4)
    assert usage.input_tokens_details.cached_tokens == row["cached_prompt_tokens"]
    assert usage.output_tokens == row["completion_tokens"] == 96
    assert usage.output_tokens_details.reasoning_tokens == row["reasoning_tokens"] == 64
    assert (row["endpoint"], row["status"], row["usage_source"]) == ("responses", "ok", "reported")


def test_a_whole_response_has_reasoning_and_text(gateway: Gateway) -> None:
    response = client(gateway).responses.create(model="vllm-only", input=PROMPT, instructions="Be brief.")
    assert response.status == "completed" and response.model == "vllm-only"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == THINKING
    assert response.output_text == ANSWER
    assert response.usage is not None
    check_books(gateway, response.usage, len("Be brief.") + len(PROMPT))


def test_a_stream_has_the_events_the_sdk_types(gateway: Gateway) -> None:
    events = list(client(gateway).responses.create(model="vllm-only", input=PROMPT, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (reasoning, text) == (THINKING, ANSWER)
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == ANSWER and done.usage is not None
    check_books(gateway, done.usage, len(PROMPT))


def test_the_sdk_stream_helper_accumulates_the_response(gateway: Gateway) -> None:
    with client(gateway).responses.stream(model="vllm-only", input=PROMPT) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == ANSWER


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_and_its_output_round_trip(gateway: Gateway, stream: bool) -> None:
    sdk = client(gateway)
    if stream:
        events = list(sdk.responses.create(model="vllm-only", input=PROMPT, tools=[TOOL], stream=True))  # type: ignore[list-item]
        assert any(e.type == "response.function_call_arguments.delta" for e in events)
        first = events[-1].response  # type: ignore[union-attr]
    else:
        first = sdk.responses.create(model="vllm-only", input=PROMPT, tools=[TOOL])  # type: ignore[list-item]
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "lookup"
    assert call.arguments == '{"query": "' + ANSWER + '"}'
    follow_up = [
        {"role": "user", "content": PROMPT},
        {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
    ]
    second = sdk.responses.create(model="vllm-only", input=follow_up, tools=[TOOL])  # type: ignore[arg-type,list-item]
    assert second.output_text == ANSWER


def test_max_output_tokens_makes_an_incomplete_response(gateway: Gateway) -> None:
    response = client(gateway).responses.create(model="vllm-only", input=PROMPT, max_output_tokens=70)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("field", "value"), [("previous_response_id", "resp_123"), ("store", True), ("conversation", "c_1")]
)
def test_stored_state_is_refused_clearly(gateway: Gateway, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).responses.create(model="vllm-only", input=PROMPT, **{field: value})  # type: ignore[call-overload]
    assert refused.value.status_code == 400
    assert "stateless" in refused.value.message or "not supported" in refused.value.message
    assert refused.value.param == field  # type: ignore[attr-defined]
