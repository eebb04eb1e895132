"""Real tokens through the gateway: the official openai SDK, only base_url changed, to llama-cpp-python's
server running Gemma 3 270M. This upstream streams no usage at all, so streams test the gateway's own
counting; every stream also yields a real TTFT and decode speed."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.request.observation import Observation
from tests.conftest import Gateway
from tests.real.conftest import BACKEND, ROUTE

pytestmark = pytest.mark.slow

# Small answers: the server decodes one request at a time on two shared CPU cores.
MAX_TOKENS = 32
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write three sentences about the sea."}
]


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="client-key-not-forwarded", max_retries=0)


def new_request_id() -> str:
    return os.urandom(8).hex()


def observation_of(gateway: Gateway, request_id: str, timeout: float = 30.0) -> Observation:
    """The gateway's record of one request; a stream's is settled just after its last byte is sent."""
    deadline = time.monotonic() + timeout
    while True:
        for observation in list(gateway.runtime.recent):
            if observation.request_id == request_id:
                return observation
        if time.monotonic() > deadline:
            raise AssertionError(f"no observation for request {request_id}")
        time.sleep(0.01)


def stream_chat(gateway: Gateway, request_id: str, **kwargs: Any) -> tuple[str, list[Any]]:
    stream = sdk(gateway).chat.completions.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_headers={"x-request-id": request_id},
        **kwargs,
    )
    chunks = list(stream)
    text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    return text, chunks


def assert_measured_stream(observation: Observation) -> None:
    attempt = observation.final
    assert attempt is not None and attempt.backend == BACKEND and attempt.status == "ok"
    assert attempt.ttft_s is not None and attempt.ttft_s > 0
    assert attempt.first_answer_s is not None and attempt.first_answer_s >= attempt.ttft_s
    assert attempt.decode_tokens_per_s is not None and attempt.decode_tokens_per_s > 0
    assert attempt.duration_s is not None and attempt.duration_s > attempt.ttft_s


def test_non_streaming_chat_returns_text_and_reported_usage(real_gateway: Gateway) -> None:
    request_id = new_request_id()
    raw = sdk(real_gateway).chat.completions.with_raw_response.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_headers={"x-request-id": request_id},
    )
    completion = raw.parse()
    assert raw.headers["x-gateway-backend"] == BACKEND
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= MAX_TOKENS
    assert completion.usage.prompt_tokens > 0
    observation = observation_of(real_gateway, request_id)
    assert observation.status == "ok" and not observation.stream, observation
    usage = observation.final.usage if observation.final else None
    assert usage is not None and usage.source == "reported"
    assert usage.completion_tokens == completion.usage.completion_tokens


@pytest.mark.parametrize("include_usage", [True, False], ids=["client-asks-usage", "client-does-not"])
def test_streaming_chat_is_counted_and_measured(real_gateway: Gateway, include_usage: bool) -> None:
    request_id = new_request_id()
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    text, chunks = stream_chat(real_gateway, request_id, **options)
    assert text.strip()
    # The gateway asked upstream for usage anyway; this server sends none, so none reaches the client.
    assert all(chunk.usage is None for chunk in chunks)
    observation = observation_of(real_gateway, request_id)
    assert observation.status == "ok" and observation.stream, observation
    assert_measured_stream(observation)
    attempt = observation.final
    assert attempt is not None and attempt.usage is not None
    assert attempt.usage.source == "counted"
    assert 0 < attempt.usage.completion_tokens <= MAX_TOKENS
    assert attempt.usage.prompt_tokens > 0


def test_counted_tokens_match_what_the_server_reports(real_gateway: Gateway) -> None:
    """Greedy decoding makes the same answer twice: the stream's count (one token per content frame)
    agrees with the upstream's own count for the non-streamed twin."""
    client = sdk(real_gateway)
    reported = client.chat.completions.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
    ).usage
    assert reported is not None
    request_id = new_request_id()
    stream_chat(real_gateway, request_id)
    attempt = observation_of(real_gateway, request_id).final
    assert attempt is not None and attempt.usage is not None and attempt.usage.source == "counted"
    # A token that ends mid-character streams as an empty frame; allow for one or two of those.
    assert abs(attempt.usage.completion_tokens - reported.completion_tokens) <= 2


def test_streaming_text_completion_is_counted_and_measured(real_gateway: Gateway) -> None:
    request_id = new_request_id()
    stream = sdk(real_gateway).completions.create(
        model=ROUTE,
        prompt="The sea is",
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_headers={"x-request-id": request_id},
    )
    text = "".join(choice.text for chunk in stream for choice in chunk.choices)
    assert text.strip()
    observation = observation_of(real_gateway, request_id)
    assert observation.endpoint == "completions"
    assert_measured_stream(observation)
    assert observation.final is not None and observation.final.usage is not None
    assert observation.final.usage.source == "counted" and observation.final.usage.completion_tokens > 0


def test_ledger_metrics_and_cost_carry_the_real_measurements(real_gateway: Gateway) -> None:
    """The row and the metrics carry what was measured, and a GPU-hour pool charges the request its
    time share: the hourly price times completion tokens over the pool's measured tokens/s."""
    request_id = new_request_id()
    stream_chat(real_gateway, request_id)
    observation = observation_of(real_gateway, request_id)
    attempt = observation.final
    assert attempt is not None and attempt.usage is not None
    runtime = real_gateway.runtime
    measured_tokens_per_s = runtime.stats.view(BACKEND).aggregate_tokens_per_s
    assert measured_tokens_per_s is not None and measured_tokens_per_s > 0
    pool = runtime.policy.backends[BACKEND].pool_price
    assert pool is not None
    time_share_s = attempt.usage.completion_tokens / measured_tokens_per_s
    assert observation.cost_basis == "gpu_hours_amortized"
    # Decode's time share, plus the prompt's (issue 13: prefill is priced too), which the row shows.
    prefill_usd = observation.prefill_cost_usd
    assert prefill_usd is not None and prefill_usd > 0
    decode_usd = observation.cost_usd - prefill_usd
    assert decode_usd == pytest.approx(pool.usd_per_hour / 3600 * time_share_s, rel=1e-6)

    row = ledger_row(real_gateway, request_id)
    assert row["backend"] == BACKEND and row["usage_source"] == "counted"
    assert row["completion_tokens"] == attempt.usage.completion_tokens
    assert row["ttft_s"] == pytest.approx(attempt.ttft_s) and row["ttft_s"] > 0
    assert row["decode_tokens_per_s"] > 0
    assert row["cost_usd"] == pytest.approx(observation.cost_usd)
    assert row["prefill_cost_usd"] == pytest.approx(prefill_usd)

    exposition = httpx.get(real_gateway.url + "/metrics").text
    assert f'gateway_ttft_seconds_count{{backend="{BACKEND}"' in exposition
    assert f'gateway_decode_tokens_per_second_count{{backend="{BACKEND}"' in exposition
    assert f'gateway_spend_usd_total{{backend="{BACKEND}"' in exposition


def ledger_row(gateway: Gateway, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The ledger row of one request, once the writer thread has committed it."""
    path = gateway.runtime.ledger.path
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
                conn.row_factory = sqlite3.Row
                found = conn.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
            if found is not None:
                return dict(found)
        time.sleep(0.1)
    raise AssertionError(f"no ledger row for request {request_id}")
