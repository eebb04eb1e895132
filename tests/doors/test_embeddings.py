"""POST /v1/embeddings routed like the rest (input tokens priced, fallback by status), and GET
/v1/models/{id}, through the official openai SDK against the gateway on the emulators."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.conftest import Gateway, Upstreams
from tests.doors.ledger import ledger_row, settled_request_id

TEXTS = ["The quick brown fox", "jumps over the lazy dog."]


def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def test_embeddings_come_back_and_their_input_tokens_are_priced(gateway: Gateway) -> None:
    result = client(gateway).embeddings.create(model="paid-only", input=TEXTS)
    assert [item.index for item in result.data] == [0, 1]
    for item in result.data:
        assert len(item.embedding) == 16
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-5)
    assert result.data[0].embedding != result.data[1].embedding
    tokens = sum(math.ceil(len(t) / 4) for t in TEXTS)
    assert result.usage.prompt_tokens == tokens
    row = ledger_row(gateway, settled_request_id(gateway, 1))
    assert (row["endpoint"], row["backend"], row["status"]) == ("embeddings", "paid-api", "ok")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (tokens, 0)
    assert row["cost_usd"] == pytest.approx(tokens * 0.6 / 1e6)  # paid-api's input price


def test_embeddings_fall_back_on_a_503(gateway: Gateway, upstreams: Upstreams) -> None:
    httpx.post(upstreams.vllm.url + "/emulator/faults", json={"error_rate": 1.0, "error_status": 503})
    response = client(gateway).embeddings.with_raw_response.create(model="pool-then-api", input="hello")
    assert response.headers["x-gateway-backend"] == "paid-api"
    assert len(response.parse().data[0].embedding) == 16


def test_embeddings_refuse_bad_input_and_streams(gateway: Gateway) -> None:
    for body in ({"model": "paid-only"}, {"model": "paid-only", "input": "x", "stream": True}):
        response = httpx.post(gateway.base_url + "/embeddings", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_one_model_by_id(gateway: Gateway) -> None:
    model = client(gateway).models.retrieve("vllm-only")
    assert (model.id, model.object) == ("vllm-only", "model")
    with pytest.raises(openai.NotFoundError):
        client(gateway).models.retrieve("no-such-route")
