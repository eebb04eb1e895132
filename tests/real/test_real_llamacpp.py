"""Real tokens through the gateway from llama.cpp's own ``llama-server`` running Gemma 3 270M: the official
openai SDK, only base_url changed. What the real server sends meets the gateway's readers here: usage in
streams (only when asked, which the gateway always does) and in final completions chunks, the ``timings``
object, ``/slots``, ``/metrics`` and ``/health``."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.backends.base import Fetched
from gateway.emulator.dialects import LlamaCppDialect
from gateway.measure.boot import read_health
from gateway.measure.signals import parse_llamacpp_metrics, parse_llamacpp_slots
from gateway.values.observation import Observation
from tests.conftest import Gateway
from tests.real.conftest import (
    BACKEND,
    ROUTE,
    SERVED_MODEL,
    SLOTS,
    LlamaServer,
    log_tail,
    skip_without_setup,
    start_llama_server,
    wait_slots_idle,
)

pytestmark = pytest.mark.slow

# Small answers: two slots decode on two shared CPU cores.
MAX_TOKENS = 32
# Long answers, for a stream that is still running while a test looks at it: EOS is ignored, so it lasts.
LONG_TOKENS = 1000
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write three sentences about the sea."}
]


def sdk(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="client-key-not-forwarded", max_retries=0)


def new_request_id() -> str:
    return os.urandom(8).hex()


def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """The first truthy value of ``check()``; only a hang is bounded, never how fast it comes."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


def observation_of(gateway: Gateway, request_id: str, timeout: float = 30.0) -> Observation:
    """The gateway's record of one request; a stream's is settled just after its last byte is sent."""

    def find() -> Observation | None:
        return next((o for o in list(gateway.runtime.recent) if o.request_id == request_id), None)

    found: Observation = eventually(find, f"an observation for request {request_id}", timeout)
    return found


def stream_chat(
    gateway: Gateway, request_id: str, max_tokens: int = MAX_TOKENS, **kwargs: Any
) -> tuple[str, list[Any]]:
    stream = sdk(gateway).chat.completions.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=max_tokens,
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


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE stream read line by line, up to ``[DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event: dict[str, Any] = orjson.loads(data)
        yield event


@contextmanager
def direct_stream(server: LlamaServer, body: dict[str, Any]) -> Iterator[Iterator[dict[str, Any]]]:
    """A chat stream straight from llama-server, to see what it sends before the gateway reads it."""
    payload = {"model": SERVED_MODEL, "messages": PROMPT, "stream": True, **body}
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", f"{server.url}/v1/chat/completions", json=payload) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        yield sse_events(reply.iter_lines())


def test_non_streaming_chat_reports_usage_and_timings(
    real_gateway: Gateway, llama_server: LlamaServer
) -> None:
    """llama-server's usage is the gateway's (prompt caching included: the same prompt twice is served
    from the slot's cache, and the cached share is recorded), and its ``timings.predicted_ms`` splits
    a non-streamed answer's time into decoding and the wait for token one."""
    results = []
    for _ in range(2):
        request_id = new_request_id()
        raw = sdk(real_gateway).chat.completions.with_raw_response.create(
            model=ROUTE,
            messages=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_headers={"x-request-id": request_id},
        )
        results.append((raw, raw.http_response.json(), observation_of(real_gateway, request_id)))
    for raw, body, observation in results:
        assert raw.headers["x-gateway-backend"] == BACKEND
        assert body["choices"][0]["message"]["content"]
        usage, timings = body["usage"], body["timings"]
        assert 0 < usage["completion_tokens"] <= MAX_TOKENS and usage["prompt_tokens"] > 0
        assert observation.status == "ok" and not observation.stream, observation
        attempt = observation.final
        assert attempt is not None and attempt.usage is not None and attempt.usage.source == "reported"
        assert attempt.usage.completion_tokens == usage["completion_tokens"] == timings["predicted_n"]
        assert attempt.usage.prompt_tokens == usage["prompt_tokens"]
        assert attempt.usage.cached_prompt_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        assert attempt.duration_s is not None and attempt.decode_s is not None and attempt.ttft_s is not None
        assert attempt.decode_s == pytest.approx(min(timings["predicted_ms"] / 1000, attempt.duration_s))
        assert attempt.ttft_s == pytest.approx(attempt.duration_s - attempt.decode_s)
        assert attempt.decode_tokens_per_s is not None and attempt.decode_tokens_per_s > 0
    second = results[1][1]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, second  # the slot kept the prompt
    assert second["timings"]["cache_n"] == second["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("include_usage", [True, False], ids=["client-asks-usage", "client-does-not"])
def test_streaming_chat_usage_is_reported_and_the_stream_measured(
    real_gateway: Gateway, include_usage: bool
) -> None:
    """The gateway always asks for stream usage, so llama-server reports it; a client that did not ask
    gets no usage chunk, one that did gets it with its cost and llama-server's ``timings`` beside it."""
    request_id = new_request_id()
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    text, chunks = stream_chat(real_gateway, request_id, **options)
    assert text.strip()
    with_usage = [chunk for chunk in chunks if chunk.usage is not None]
    observation = observation_of(real_gateway, request_id)
    assert observation.status == "ok" and observation.stream, observation
    assert_measured_stream(observation)
    attempt = observation.final
    assert attempt is not None and attempt.usage is not None and attempt.usage.source == "reported"
    assert 0 < attempt.usage.completion_tokens <= MAX_TOKENS and attempt.usage.prompt_tokens > 0
    if not include_usage:
        assert with_usage == []
        return
    [last] = with_usage
    assert last is chunks[-1] and last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == attempt.usage.completion_tokens
    extra = last.model_extra or {}
    assert extra["timings"]["predicted_n"] == attempt.usage.completion_tokens
    reported = last.usage.model_extra or {}
    assert reported["cost"] == pytest.approx(observation.cost_usd)


def test_the_gateway_times_a_stream_as_llama_server_does(real_gateway: Gateway) -> None:
    """What the gateway measures on the wire agrees with llama-server's own ``timings``: its TTFT holds
    the server's prompt time, and its decode speed is the server's (measured: within 0.5%; the bound
    here is loose, for a slow shared machine)."""
    request_id = new_request_id()
    tokens = 64
    _, chunks = stream_chat(
        real_gateway,
        request_id,
        max_tokens=tokens,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    timings = (chunks[-1].model_extra or {})["timings"]
    attempt = observation_of(real_gateway, request_id).final
    assert attempt is not None and attempt.usage is not None
    assert attempt.usage.completion_tokens == timings["predicted_n"] == tokens
    assert attempt.ttft_s is not None and attempt.ttft_s >= timings["prompt_ms"] / 1000
    measured = attempt.decode_tokens_per_s
    assert measured is not None
    assert 0.4 < measured / timings["predicted_per_second"] < 2.5, (measured, timings)


def test_a_stream_sends_usage_only_when_asked_and_one_token_a_frame(llama_server: LlamaServer) -> None:
    """Straight from llama-server: a chat stream carries no usage unless ``include_usage`` asks (why the
    gateway asks), yet its last chunk has ``timings``; and it streams one token per content frame, the
    rule the gateway counts by when an upstream reports nothing."""
    body = {"max_tokens": MAX_TOKENS, "temperature": 0}
    with direct_stream(llama_server, body) as events:
        frames = list(events)
    assert all("usage" not in frame for frame in frames)
    content_frames = sum(1 for frame in frames for c in frame["choices"] if c["delta"].get("content"))
    timings = frames[-1]["timings"]
    assert frames[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    # A token that ends mid-character streams with the next one; allow for one or two of those.
    assert abs(content_frames - timings["predicted_n"]) <= 2, (content_frames, timings)
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}

    with direct_stream(llama_server, {**body, "stream_options": {"include_usage": True}}) as events:
        frames = list(events)
    usage_frame = frames[-1]
    assert usage_frame["choices"] == [] and "timings" in usage_frame
    assert usage_frame["usage"]["completion_tokens"] == usage_frame["timings"]["predicted_n"]
    assert all("usage" not in frame for frame in frames[:-1])


def test_streaming_text_completion_reports_usage_in_its_final_chunk(real_gateway: Gateway) -> None:
    """/v1/completions streams end with a chunk that has the finish reason, usage and timings together."""
    request_id = new_request_id()
    stream = sdk(real_gateway).completions.create(
        model=ROUTE,
        prompt="The sea is",
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_headers={"x-request-id": request_id},
    )
    chunks = list(stream)
    assert "".join(choice.text for chunk in chunks for choice in chunk.choices).strip()
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length") and final.usage is not None
    observation = observation_of(real_gateway, request_id)
    assert observation.endpoint == "completions"
    assert_measured_stream(observation)
    usage = observation.final.usage if observation.final else None
    assert usage is not None and usage.source == "reported"
    assert usage.completion_tokens == final.usage.completion_tokens > 0


def admin_backend(gateway: Gateway) -> dict[str, Any]:
    reply = httpx.get(gateway.url + "/admin/backends", timeout=10.0)
    reply.raise_for_status()
    backend: dict[str, Any] = reply.json()["backends"][BACKEND]
    return backend


def test_the_scraper_reads_slots_metrics_and_health_of_the_real_server(
    real_gateway: Gateway, llama_server: LlamaServer
) -> None:
    """/admin/backends shows what the gateway scraped off llama-server: both slots, the one a stream
    holds, requests processing, and the tokens-predicted counter (with its rate) grown by the stream."""
    wait_slots_idle(llama_server)
    idle = eventually(
        lambda: (b := admin_backend(real_gateway))["signals"] and b["signals"]["slots_busy"] == 0 and b,
        "the scraper sees both slots idle",
    )
    assert idle["signals"]["slots_total"] == SLOTS
    scrape = idle["scrape"]
    assert scrape["healthy"] is True and scrape["stale"] is False and scrape["last_error"] is None
    before = idle["signals"]["generation_tokens_total"]
    assert before is not None

    request_id = new_request_id()
    with sdk(real_gateway).chat.completions.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=LONG_TOKENS,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": request_id},
    ) as stream:
        next(iter(stream))
        busy = eventually(
            lambda: (
                (s := admin_backend(real_gateway)["signals"])["slots_busy"] == 1 and s["running"] == 1 and s
            ),
            "the scraper sees the stream's slot busy",
        )
        assert busy["slots_total"] == SLOTS and busy["waiting"] == 0
        # llama-server adds a request's tokens to llamacpp:tokens_predicted_total when its slot is
        # released, not as they are decoded: the counter stands still while the stream runs.
        assert busy["generation_tokens_total"] == before
    # The client left: its slot is freed (the next test looks at that closely).
    wait_slots_idle(llama_server)
    after = eventually(
        lambda: (s := admin_backend(real_gateway)["signals"])["generation_tokens_total"] > before and s,
        "the tokens-predicted counter grows",
    )
    assert after["slots_busy"] == 0 and after["running"] == 0
    # A rate between two scrapes: lumpy (zero while streams run, a jump when they end), never negative.
    assert after["generation_tokens_per_s"] is not None and after["generation_tokens_per_s"] >= 0


def test_a_client_that_leaves_mid_stream_frees_its_slot(
    real_gateway: Gateway, llama_server: LlamaServer
) -> None:
    """The gateway cuts the upstream connection when its client hangs up: llama-server cancels the task,
    /slots shows the slot idle again, and it decoded far fewer than the LONG_TOKENS it was asked for."""
    wait_slots_idle(llama_server)
    predicted_before = tokens_predicted(llama_server)
    request_id = new_request_id()
    with sdk(real_gateway).chat.completions.create(
        model=ROUTE,
        messages=PROMPT,
        max_tokens=LONG_TOKENS,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": request_id},
    ) as stream:
        chunks = iter(stream)
        for _ in range(5):
            next(chunks)
        busy = eventually(
            lambda: [slot for slot in llama_server.slots() if slot["is_processing"]],
            "the stream's slot is busy",
        )
        assert [slot["params"]["n_predict"] for slot in busy] == [LONG_TOKENS]
    wait_slots_idle(llama_server)
    decoded = tokens_predicted(llama_server) - predicted_before  # counted when the slot was released
    assert 5 <= decoded < LONG_TOKENS, decoded
    assert "cancel task" in log_tail(llama_server.log_path, chars=20_000)
    observation = observation_of(real_gateway, request_id)
    assert observation.status == "cancelled", observation


def tokens_predicted(server: LlamaServer) -> float:
    total = parse_llamacpp_metrics(server.metrics(), time.monotonic(), None).generation_tokens_total
    assert total is not None
    return total


def test_metrics_show_requests_processing_and_deferred(llama_server: LlamaServer) -> None:
    """One stream more than llama-server has slots: /metrics says two are processing and one deferred,
    /slots that both slots are busy, as the gateway's parsers read them."""
    wait_slots_idle(llama_server)
    stop = threading.Event()
    failures: list[BaseException] = []

    def read_until_stopped() -> None:
        # Each stream on its own thread: the deferred one answers only once a slot is free.
        try:
            with direct_stream(llama_server, {"max_tokens": LONG_TOKENS, "ignore_eos": True}) as events:
                for _ in events:
                    if stop.is_set():
                        return
        except BaseException as exc:  # reported by the test thread below
            failures.append(exc)

    readers = [threading.Thread(target=read_until_stopped, daemon=True) for _ in range(SLOTS + 1)]
    for reader in readers:
        reader.start()
    try:

        def loaded() -> Any:
            load = parse_llamacpp_metrics(llama_server.metrics(), time.monotonic(), None)
            return load.running == SLOTS and load.waiting == 1 and load

        load = eventually(loaded, "two requests processing and one deferred")
        assert load.generation_tokens_total is not None
        assert parse_llamacpp_slots(llama_server.slots()) == (SLOTS, SLOTS)
        text = llama_server.metrics()
        for name in ("llamacpp:predicted_tokens_seconds", "llamacpp:prompt_tokens_seconds"):
            assert f"\n{name} " in text, name
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=120)
    assert not failures, failures
    assert not any(reader.is_alive() for reader in readers)
    wait_slots_idle(llama_server)


def test_health_answers_503_while_the_model_loads(tmp_path: Any) -> None:
    """A fresh llama-server listens before its model is loaded: /health (and every other endpoint) says
    503 "Loading model" in the shape the emulator copies, then 200; the gateway reads 503 as booting."""
    skip_without_setup()
    log_path = tmp_path / "server.log"
    process, url = start_llama_server(log_path, slots=1)
    seen: list[tuple[int, Any]] = []
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=5.0) as client:
            while not seen or seen[-1][0] != 200:
                assert process.proc is not None and process.proc.poll() is None, log_tail(log_path)
                assert time.monotonic() < deadline, f"{url} never got ready:\n{log_tail(log_path)}"
                try:
                    reply = client.get(f"{url}/health")
                except httpx.TransportError:
                    continue  # not listening yet
                seen.append((reply.status_code, reply.json()))
    finally:
        process.stop()
    # Loading takes seconds (measured: ~3-5 s on two shared cores), polling is back-to-back: 503s are seen.
    loading = [body for status, body in seen if status == 503]
    assert {status for status, _ in seen} <= {200, 503}
    assert seen[-1] == (200, {"status": "ok"})
    assert loading and loading[0] == LlamaCppDialect().error(503, "Loading model"), seen[:3]
    loading_read = read_health("llamacpp", Fetched(503), ready_once=False, waited_s=0.0, expected_boot_s=None)
    assert (loading_read.healthy, loading_read.booting) == (False, True)
    assert read_health("llamacpp", Fetched(200), ready_once=False, waited_s=0.0, expected_boot_s=None).healthy


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
    assert row["backend"] == BACKEND and row["usage_source"] == "reported"
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

    def find() -> dict[str, Any] | None:
        if not path.exists():
            return None
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            conn.row_factory = sqlite3.Row
            found = conn.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,)).fetchone()
        return None if found is None else dict(found)

    row: dict[str, Any] = eventually(find, f"a ledger row for request {request_id}", timeout)
    return row


def test_a_prompt_longer_than_a_slot_is_the_clients_400_not_a_5xx(real_gateway: Gateway) -> None:
    """Digits are a token each for Gemma, four to a token in the gateway's estimate: the gateway lets
    this prompt through, and llama-server refuses it (``exceed_context_size_error``). The client gets
    an OpenAI 400 with the server's reason, streamed or not, and nothing is tried elsewhere."""
    content = "0123456789" * 300  # ~750 tokens estimated, 3,000 real, over the 2,048 of a slot
    for stream in (False, True):
        request_id = new_request_id()
        reply = httpx.post(
            real_gateway.base_url + "/chat/completions",
            json={"model": ROUTE, "messages": [{"role": "user", "content": content}], "stream": stream},
            headers={"x-request-id": request_id},
            timeout=120.0,
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (
            error["type"] == "invalid_request_error"
            and "exceeds the available context size" in error["message"]
        )
        observation = observation_of(real_gateway, request_id)
        assert observation.status == "error" and len(observation.attempts) == 1
        assert observation.attempts[0].http_status == 400
