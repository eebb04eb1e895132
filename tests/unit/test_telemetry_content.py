"""The prompt and the answer in a trace (``telemetry.content: true``): the client's prompt as the GenAI
conventions' ``gen_ai.input.messages``, a whole answer's body and a stream's meter as their
``gen_ai.output.messages``, each bounded at ``MAX_ANSWER_CHARS`` characters; and a stream's meter keeps no
more than that of an answer it keeps only for the trace."""

from __future__ import annotations

import gc
import json

import orjson

from gateway.measure.meter import StreamMeter
from gateway.measure.transcript import Transcript
from gateway.telemetry.content import KEPT_STREAM_CHARS, MAX_ANSWER_CHARS, input_messages, output_messages
from gateway.telemetry.record import request_record
from gateway.values.observation import Attempt, Observation


def chunk(**choice: object) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "choices": [{"index": 0, **choice}]}) + b"\n\n"


def test_a_whole_chat_answer_with_a_tool_call() -> None:
    body = orjson.dumps(
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "Let me look.",
                        "tool_calls": [
                            {"id": "t1", "function": {"name": "search", "arguments": '{"q": "x"}'}}
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    said = json.loads(output_messages(body, "chat", ok=True) or "")
    assert said == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Let me look."},
                {"type": "tool_call", "id": "t1", "name": "search", "arguments": '{"q": "x"}'},
            ],
            "finish_reason": "tool_calls",
        }
    ]


def test_a_completion_and_what_holds_no_message() -> None:
    body = b'{"choices": [{"text": "once upon", "finish_reason": "length"}]}'
    (said,) = json.loads(output_messages(body, "text_completion", ok=True) or "")
    assert said["parts"] == [{"type": "text", "content": "once upon"}] and said["finish_reason"] == "length"
    assert output_messages(b'{"data": [{"embedding": [0.1]}]}', "embeddings", ok=True) is None
    assert output_messages(b"not json", "chat", ok=True) is None
    # A stream cut before its last chunk said why it ended: the schema wants a reason all the same.
    (cut,) = json.loads(output_messages((("half an ans", None, ()),), "chat", ok=False) or "")
    assert cut["finish_reason"] == "error" and cut["parts"][0]["content"] == "half an ans"


def test_an_answer_is_cut_at_the_bound_and_says_so() -> None:
    long = "x" * (MAX_ANSWER_CHARS + 500)
    body = orjson.dumps({"choices": [{"message": {"content": long}, "finish_reason": "stop"}]})
    for answer in (body, ((long[:KEPT_STREAM_CHARS], "stop", ()),)):
        (said,) = json.loads(output_messages(answer, "chat", ok=True) or "")
        assert len(said["parts"][0]["content"]) == MAX_ANSWER_CHARS and said["gateway.truncated"] is True
    (whole,) = json.loads(output_messages((("x" * MAX_ANSWER_CHARS, "stop", ()),), "chat", ok=True) or "")
    assert "gateway.truncated" not in whole


def test_a_meter_keeps_a_bounded_answer_and_its_finish_reason_for_the_trace() -> None:
    attempt = Attempt("b", 0.0)
    kept = Transcript(resumes=False, keep_chars=10)
    meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=5, transcript=kept)
    meter.feed(chunk(delta={"role": "assistant", "reasoning_content": "hmm"}), 0.1)
    meter.feed(chunk(delta={"content": "Hello, "}) + chunk(delta={"content": "world, and more"}), 0.2)
    meter.feed(chunk(delta={}, finish_reason="stop") + b"data: [DONE]\n\n", 0.3)
    assert "".join(kept.answer) == "Hello, wor" and kept.reasoning == [] and kept.finish_reason == "stop"
    assert meter.answer_chunks == 2 and meter.done
    # /v1/completions streams say their text in ``text``
    text = Transcript(resumes=False, keep_chars=100)
    meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=5, transcript=text)
    meter.feed(chunk(text="once ") + chunk(text="upon", finish_reason="length"), 0.1)
    assert "".join(text.answer) == "once upon" and text.finish_reason == "length"


def test_a_stream_that_may_be_resumed_keeps_all_of_it_and_the_record_what_the_trace_holds() -> None:
    resumable = Transcript()
    resumable.answered("y" * (KEPT_STREAM_CHARS + 7), None)
    resumable.finish_reason = "stop"
    observation = Observation("r", "route", "chat", True, 1.0, finished_at=2.0)
    record = request_record(
        (bytes(16), bytes(8), b"", "", 0.0), {}, (), observation, None, {}, None, resumable
    )
    assert len(resumable.answer[0]) == KEPT_STREAM_CHARS + 7, "a resume needs the whole answer"
    assert record[-1] == (("y" * KEPT_STREAM_CHARS, "stop", ()),)


def test_a_chat_prompt_becomes_input_messages_of_parts() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 1000}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "look", "arguments": '{"q": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a cat"},
    ]
    assert json.loads(input_messages(messages)) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        # an image is named by its type only: its data stays out of the trace
        {"role": "user", "parts": [{"type": "text", "content": "What is this?"}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "t1", "name": "look", "arguments": '{"q": 1}'}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "t1", "response": "a cat"}]},
    ]


def test_a_completion_prompt_and_a_responses_input_become_input_messages() -> None:
    assert json.loads(input_messages("once")) == [
        {"role": "user", "parts": [{"type": "text", "content": "once"}]}
    ]
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "id": "r1", "summary": []},  # no message: left out
    ]
    assert json.loads(input_messages(items)) == [
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "weather", "arguments": "{}"}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
    ]


def test_a_prompt_is_cut_at_the_bound_and_says_so() -> None:
    long = "y" * MAX_ANSWER_CHARS
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": long},
        {"role": "user", "content": "left out"},
    ]
    system, user = json.loads(input_messages(messages))
    assert "gateway.truncated" not in system
    assert user["parts"] == [{"type": "text", "content": long[: MAX_ANSWER_CHARS - 3]}]
    assert user["gateway.truncated"] is True
    # the whole prompt's text, however long, stays within the bound
    many = [{"role": "user", "content": "z" * 1000}] * 100
    said = json.loads(input_messages(many))
    assert sum(len(m["parts"][0]["content"]) for m in said) == MAX_ANSWER_CHARS
    assert said[-1]["gateway.truncated"] is True and len(said) == MAX_ANSWER_CHARS // 1000 + 1
    exact = json.loads(input_messages([{"role": "user", "content": long}]))
    assert "gateway.truncated" not in exact[0]
    # through the record the exporter writes from
    observation = Observation("r", "route", "chat", False, 1.0, finished_at=2.0)
    record = request_record((bytes(16), bytes(8), b"", "", 0.0), {}, (), observation, None, {}, messages)
    assert record[25] == input_messages(messages)


def test_a_streamed_tool_call_is_in_the_output_messages() -> None:
    attempt = Attempt("b", 0.0)
    kept = Transcript(resumes=False, keep_chars=KEPT_STREAM_CHARS)
    meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=5, transcript=kept)
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}}
    meter.feed(chunk(delta={"role": "assistant", "content": "Checking."}), 0.1)
    meter.feed(chunk(delta={"tool_calls": [call]}), 0.2)
    for piece in ('{"city"', ': "Oslo"}'):
        meter.feed(chunk(delta={"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), 0.3)
    meter.feed(chunk(delta={}, finish_reason="tool_calls") + b"data: [DONE]\n\n", 0.4)
    observation = Observation("r", "route", "chat", True, 1.0, finished_at=2.0)
    record = request_record((bytes(16), bytes(8), b"", "", 0.0), {}, (), observation, None, {}, None, kept)
    (said,) = json.loads(output_messages(record[-1], "chat", ok=True) or "")
    assert said == {
        "role": "assistant",
        "parts": [
            {"type": "text", "content": "Checking."},
            {"type": "tool_call", "id": "call_1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        ],
        "finish_reason": "tool_calls",
    }
    # its arguments count towards the bound, as the text does
    cut = Transcript(resumes=False, keep_chars=KEPT_STREAM_CHARS)
    cut.answered("a" * (MAX_ANSWER_CHARS - 5), None)
    cut.answered(None, [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "0123456789"}}])
    cut.finish_reason = "tool_calls"
    (said,) = json.loads(
        output_messages(
            request_record((bytes(16), bytes(8), b"", "", 0.0), {}, (), observation, None, {}, None, cut)[-1],
            "chat",
            ok=True,
        )
        or ""
    )
    assert said["parts"][1]["arguments"] == "01234" and said["gateway.truncated"] is True


def test_a_stream_of_two_choices_keeps_each_apart_and_is_not_resumed() -> None:
    """``n: 2``: each chunk names its choice (``choices[].index``). The texts are two messages in the
    trace, not one mixed; a continuation goes on from one text, so such a stream is never resumed, and
    the choices share the one room a request has in its trace (its first choice, kept whole until the
    second appeared, is bounded from then on)."""
    attempt = Attempt("b", 0.0)
    transcript = Transcript()  # may be resumed (a route with resume_streams), and traced
    meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=5, transcript=transcript)
    meter.feed(chunk(delta={"role": "assistant", "content": "Red "}), 0.1)
    assert transcript.resumable
    meter.feed(chunk(delta={"role": "assistant", "content": "Blue "}, index=1), 0.1)
    meter.feed(chunk(delta={"content": "apple"}) + chunk(delta={"content": "sky"}, index=1), 0.2)
    meter.feed(chunk(delta={}, finish_reason="stop") + chunk(delta={}, finish_reason="length", index=1), 0.3)
    assert not transcript.resumable, "two texts cannot be continued as one"
    assert "".join(transcript.answer) == "Red apple", "the first choice's text alone"
    observation = Observation("r", "route", "chat", True, 1.0, finished_at=2.0)
    record = request_record(
        (bytes(16), bytes(8), b"", "", 0.0), {}, (), observation, None, {}, None, transcript
    )
    first, second = json.loads(output_messages(record[-1], "chat", ok=True) or "")
    assert first["parts"] == [{"type": "text", "content": "Red apple"}] and first["finish_reason"] == "stop"
    assert second["parts"] == [{"type": "text", "content": "Blue sky"}]
    assert second["finish_reason"] == "length"
    # one room for the request: a second choice takes what the first left
    bounded = Transcript()
    bounded.answered("a" * (KEPT_STREAM_CHARS - 3), None)
    bounded.choice(1).answered("bcdefg", None)
    assert "".join(bounded.choice(1).answer) == "bcd"


def test_a_transcript_and_its_choices_are_freed_without_the_cyclic_collector() -> None:
    """Every stream that may be resumed keeps a transcript: one in a reference cycle would be one per
    stream for the collector (``gateway.process`` keeps it rare on the promise that there is none)."""
    gc.collect()
    gc.disable()
    try:
        transcript = Transcript()
        transcript.answered("Red", None)
        transcript.choice(1).answered("Blue", None)
        del transcript
        assert not [o for o in gc.get_objects() if isinstance(o, Transcript)]
    finally:
        gc.enable()
