"""The walking skeleton end to end: the official openai SDK, with only base_url changed, through the
gateway to each emulated upstream, streaming and not; dialect details; fallback before the first byte."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import PAID_KEY, Gateway, Upstreams, running_gateway
from tests.servers import threaded_server

HELLO = [{"role": "user", "content": "Say hello"}]
ROUTES = {"vllm-only": "b300-vllm", "llamacpp-only": "a100-llamacpp", "paid-only": "paid-api"}


def sdk(gateway: Gateway, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gateway.base_url, api_key="client-key-not-forwarded", max_retries=0, **kwargs
    )


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def last_observation(gateway: Gateway) -> Any:
    wait_for(lambda: len(gateway.runtime.recent) > 0)
    return gateway.runtime.recent[-1]


def upstream_requests(server: Any) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = httpx.get(server.url + "/emulator/requests").json()
    return [r for r in requests if r["path"].endswith("/completions")]


def set_faults(server: Any, **faults: Any) -> None:
    httpx.post(server.url + "/emulator/faults", json=faults).raise_for_status()


@pytest.mark.parametrize("route", list(ROUTES))
def test_non_streaming_chat_through_each_backend(gateway: Gateway, route: str) -> None:
    raw = sdk(gateway).chat.completions.with_raw_response.create(model=route, messages=HELLO)
    completion = raw.parse()
    assert raw.headers["x-gateway-backend"] == ROUTES[route]
    assert raw.headers["x-gateway-route"] == route
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    message = completion.choices[0].message.model_dump()
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    assert reasoning, "mandatory-thinking backends return their reasoning text"
    if route != "llamacpp-only":  # llama.cpp never counts reasoning tokens
        details = completion.usage.completion_tokens_details
        assert details is not None and details.reasoning_tokens
    observation = last_observation(gateway)
    assert observation.backend == ROUTES[route] and observation.status == "ok"
    assert observation.final.usage.completion_tokens == completion.usage.completion_tokens
    assert observation.final.decode_tokens_per_s, "non-streamed answers feed decode speed too"
    if route == "llamacpp-only":  # its `timings` tell decode time apart from waiting for token one
        assert observation.final.ttft_s is not None


@pytest.mark.parametrize("route", list(ROUTES))
def test_streaming_chat_through_each_backend(gateway: Gateway, route: str) -> None:
    stream = sdk(gateway).chat.completions.create(
        model=route, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    content, reasoning, usage = "", "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
    assert content and reasoning
    assert usage is not None and usage.completion_tokens > 0
    observation = last_observation(gateway)
    attempt = observation.final
    assert attempt.backend == ROUTES[route]
    assert attempt.ttft_s is not None and attempt.first_answer_s is not None
    assert attempt.first_answer_s >= attempt.ttft_s, "thinking comes before the answer"
    assert attempt.decode_tokens_per_s and attempt.decode_tokens_per_s > 0
    assert attempt.usage.completion_tokens == usage.completion_tokens
    assert attempt.usage.reasoning_tokens > 0


def test_completions_endpoint_streaming_and_not(gateway: Gateway) -> None:
    client = sdk(gateway)
    text = client.completions.create(model="vllm-only", prompt="Once upon a time", max_tokens=8)
    assert text.choices[0].text
    chunks = list(client.completions.create(model="paid-only", prompt="Once", max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_usage_is_requested_upstream_and_stripped_when_the_client_did_not_ask(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    chunks = list(sdk(gateway).chat.completions.create(model="vllm-only", messages=HELLO, stream=True))
    assert all(chunk.usage is None for chunk in chunks), "the client never asked for usage"
    assert all(chunk.choices for chunk in chunks), "the usage-only chunk is held back"
    sent = upstream_requests(upstreams.vllm)[-1]["body"]
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "moonshotai/Kimi-K3", "the route name is swapped for the backend's model"
    observation = last_observation(gateway)
    assert observation.final.usage.source == "reported" and observation.final.usage.reasoning_tokens > 0


def test_usage_on_every_frame_is_not_double_counted(gateway: Gateway, upstreams: Upstreams) -> None:
    set_faults(upstreams.vllm, continuous_usage=True)
    chunks = list(
        sdk(gateway).chat.completions.create(
            model="vllm-only", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    final = [c.usage for c in chunks if c.usage is not None][-1]
    observation = last_observation(gateway)
    assert observation.final.usage.completion_tokens == final.completion_tokens
    assert observation.final.usage.prompt_tokens == final.prompt_tokens


def test_older_vllm_reasoning_content_field_is_measured(gateway: Gateway, upstreams: Upstreams) -> None:
    set_faults(upstreams.vllm, reasoning_field="reasoning_content")
    chunks = list(sdk(gateway).chat.completions.create(model="vllm-only", messages=HELLO, stream=True))
    assert any((c.choices and c.choices[0].delta.model_dump().get("reasoning_content")) for c in chunks)
    attempt = last_observation(gateway).final
    assert attempt.ttft_s is not None and attempt.ttft_s < attempt.first_answer_s


def test_stream_without_usage_is_counted_and_marked(gateway: Gateway, upstreams: Upstreams) -> None:
    set_faults(upstreams.llamacpp, omit_stream_usage=True)
    chunks = list(
        sdk(gateway).chat.completions.create(
            model="llamacpp-only", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    text_chunks = [
        c
        for c in chunks
        if c.choices
        and (c.choices[0].delta.content or c.choices[0].delta.model_dump().get("reasoning_content"))
    ]
    usage = last_observation(gateway).final.usage
    assert usage.source == "counted"
    assert usage.completion_tokens == len(text_chunks)
    assert 0 < usage.reasoning_tokens < usage.completion_tokens
    assert usage.prompt_tokens > 0


def test_chunks_reach_the_client_while_the_upstream_is_still_generating(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    set_faults(upstreams.vllm, content_tokens=400, slowdown=20)
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            gateway.base_url + "/chat/completions",
            json={"model": "vllm-only", "messages": HELLO, "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept referenced: a dropped iterator closes the response
        first = next(lines)
        assert first.startswith("data: ")
        state = httpx.get(upstreams.vllm.url + "/emulator/state").json()
        assert state["running"] >= 1, "the first chunk arrived while the upstream was still generating"
        assert sum(1 for line in lines if line.startswith("data: ")) > 400, "and the rest followed"


def test_backend_gets_its_own_credential_never_the_clients(gateway: Gateway, upstreams: Upstreams) -> None:
    sdk(gateway).chat.completions.create(model="paid-only", messages=HELLO)
    headers = {k.lower(): v for k, v in upstream_requests(upstreams.paid)[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {PAID_KEY}"
    vllm_headers = [{k.lower() for k in r["headers"]} for r in upstream_requests(upstreams.vllm)]
    assert all("authorization" not in h for h in vllm_headers)


@pytest.mark.parametrize("stream", [False, True])
def test_failing_backend_falls_back_before_any_byte(
    gateway: Gateway, upstreams: Upstreams, stream: bool
) -> None:
    set_faults(upstreams.vllm, error_rate=1.0, error_status=503)
    raw = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "pool-then-api", "messages": HELLO, "stream": stream},
        timeout=30,
    )
    assert raw.status_code == 200
    assert raw.headers["x-gateway-backend"] == "paid-api"
    observation = last_observation(gateway)
    assert [a.backend for a in observation.attempts] == ["b300-vllm", "paid-api"]
    assert observation.attempts[0].http_status == 503


def test_every_backend_failing_is_a_502_in_openai_format(gateway: Gateway, upstreams: Upstreams) -> None:
    set_faults(upstreams.vllm, error_rate=1.0)
    with pytest.raises(openai.APIStatusError) as caught:
        sdk(gateway).chat.completions.create(model="vllm-only", messages=HELLO)
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "upstream_failed"
    assert upstreams.vllm.url not in str(body), "internal URLs never reach clients"


def test_upstream_dying_mid_stream_sends_an_error_event_then_closes(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    set_faults(upstreams.vllm, drop_after_chunks=5)
    received = 0
    with pytest.raises(openai.APIError, match="stream"):
        for _ in sdk(gateway).chat.completions.create(model="vllm-only", messages=HELLO, stream=True):
            received += 1
    assert received >= 1
    attempt = last_observation(gateway).final
    assert attempt.status == "dropped"


@pytest.mark.parametrize("stream", [False, True])
def test_hanging_backend_times_out_and_falls_back(
    gateway: Gateway, upstreams: Upstreams, stream: bool
) -> None:
    set_faults(upstreams.vllm, hang=True)
    policy = gateway.policy_path.read_text().replace("first_byte_s: 5", "first_byte_s: 0.5, answer_s: 0.5")
    gateway.policy_path.write_text(policy)
    assert gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]
    body = {"model": "pool-then-api", "messages": HELLO, "stream": stream}
    raw = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert raw.status_code == 200 and raw.headers["x-gateway-backend"] == "paid-api"
    assert last_observation(gateway).attempts[0].status == "timeout"


def test_models_lists_the_routes(gateway: Gateway) -> None:
    ids = {model.id for model in sdk(gateway).models.list()}
    assert ids == {"kimi-k3", "vllm-only", "llamacpp-only", "paid-only", "pool-then-api"}


def test_health_and_ready(gateway: Gateway, upstreams: Upstreams) -> None:
    assert httpx.get(gateway.url + "/health").json()["status"] == "ok"
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert ready.json()["backends"]["b300-vllm"] == "ok"


def test_a_stream_that_arrives_in_one_read_is_complete(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unpaced upstream may deliver the whole stream, [DONE] included, in the first network read."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        *({"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]} for i in range(5)),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}},
    ]
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"

    async def whole_stream(request: Request) -> Response:
        return Response(body, media_type="text/event-stream")

    upstream = Starlette(routes=[Route("/v1/chat/completions", whole_stream, methods=["POST"])])
    with threaded_server(upstream) as server:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            f"""
backends:
  burst:
    dialect: openai
    url: {server.url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}}}
routes:
  burst: {{backends: [burst]}}
"""
        )
        with running_gateway(policy) as gateway:
            for _ in range(5):
                chunks = list(
                    sdk(gateway).chat.completions.create(model="burst", messages=HELLO, stream=True)
                )
                assert (
                    "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    == "w0 w1 w2 w3 w4 "
                )
                observation = last_observation(gateway)
                assert observation.status == "ok" and observation.final.status == "ok"
                assert observation.final.usage.completion_tokens == 5


def test_a_stream_that_goes_silent_ends_with_a_timeout_event(gateway: Gateway, upstreams: Upstreams) -> None:
    policy = gateway.policy_path.read_text().replace("idle_s: 2", "idle_s: 0.3")
    gateway.policy_path.write_text(policy)
    assert gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]
    set_faults(upstreams.vllm, slowdown=20000)  # seconds between tokens once the first is out
    with pytest.raises(openai.APIError, match="silent"):
        for _ in sdk(gateway).chat.completions.create(model="vllm-only", messages=HELLO, stream=True):
            pass
    attempt = last_observation(gateway).final
    assert attempt.status == "timeout"


@pytest.mark.parametrize("stream", [False, True])
def test_answers_name_the_route_asked_for_and_the_upstream_model_in_a_header(
    gateway: Gateway, stream: bool
) -> None:
    """The model field says what the client asked for (as most gateways do); the backend's own model
    name is in ``x-gateway-upstream-model``."""
    raw = sdk(gateway).chat.completions.with_raw_response.create(
        model="vllm-only", messages=HELLO, stream=stream
    )
    assert raw.headers["x-gateway-upstream-model"] == "moonshotai/Kimi-K3"
    parsed = raw.parse()
    models = {chunk.model for chunk in parsed} if stream else {parsed.model}  # type: ignore[union-attr]
    assert models == {"vllm-only"}


@pytest.mark.parametrize("route", ["vllm-only", "paid-only"])
def test_the_openai_sdk_reads_the_cost_from_the_usage_streamed_or_not(gateway: Gateway, route: str) -> None:
    """As OpenRouter does: ``usage.cost`` (USD) and ``usage.cost_basis``, equal to the ledger's cost."""
    client = sdk(gateway)
    whole = client.chat.completions.create(model=route, messages=HELLO)
    assert whole.usage is not None
    whole_cost = whole.usage.model_extra["cost"]  # type: ignore[index]
    assert whole_cost > 0 and whole.usage.model_extra["cost_basis"] in ("per_token", "gpu_hours_amortized")  # type: ignore[index]
    assert whole_cost == pytest.approx(last_observation(gateway).cost_usd, rel=1e-6)

    stream = client.chat.completions.create(
        model=route, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1
    streamed_cost = usages[0].model_extra["cost"]  # type: ignore[index]
    wait_for(lambda: len(gateway.runtime.recent) == 2)
    assert streamed_cost > 0
    assert streamed_cost == pytest.approx(gateway.runtime.recent[-1].cost_usd, rel=1e-6)
