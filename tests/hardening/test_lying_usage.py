"""An upstream that lies about usage: a negative count would have credited the key's budget (a negative
cost), and a count of 2^62 tokens would have reached the budgets and rate limits as it was, while the
ledger clamped its row. Counts are clamped where usage enters (``values/dialect.py``), so the client's
cost, the budget's counter and the ledger's row agree, and none is below zero."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.values.dialect import TOKEN_LIMIT
from tests.conftest import Gateway, running_gateway
from tests.doors.ledger import ledger_row, settled_request_id
from tests.hardening.test_one_read_stream import OneWriteUpstream

LIES = {
    "prompt_tokens": -(10**9),
    "completion_tokens": 2**62,
    "total_tokens": 5,
    "prompt_tokens_details": {"cached_tokens": 10**6},
    "completion_tokens_details": {"reasoning_tokens": 2**63},
}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    with OneWriteUpstream(LIES).running() as url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(f"""
backends:
  liar:
    dialect: openai
    url: {url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 10}}}}
routes:
  liar: {{backends: [liar], budgets: {{per_day_usd: 1000000000}}}}
ledger: {{path: {tmp_path / "ledger.sqlite3"}, flush_interval_s: 0.05}}
tuning: {{probes: {{enabled: false}}}}
""")
        with running_gateway(policy) as gateway:
            yield gateway


def test_a_lying_upstreams_counts_are_clamped_alike_everywhere(gateway: Gateway) -> None:
    body = {"model": "liar", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    expected = TOKEN_LIMIT * 10 / 1e6  # no prompt (a negative count is none), the completion at the limit
    cost = [line for line in response.text.splitlines() if '"cost":' in line]
    assert len(cost) == 1 and f'"cost":{round(expected, 10)}' in cost[0].replace(" ", ""), cost

    runtime = gateway.runtime
    request_id = settled_request_id(gateway, 1)
    usage = runtime.recent[-1].final.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (0, TOKEN_LIMIT)
    assert (usage.reasoning_tokens, usage.cached_prompt_tokens) == (TOKEN_LIMIT, 0)
    spent = list(runtime.budgets.usage(runtime.policy_source.current, runtime.wall_clock()))
    assert spent and all(use.spent_usd == pytest.approx(expected) for use in spent), spent
    row = ledger_row(gateway, request_id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (0, TOKEN_LIMIT)
    assert row["cost_usd"] == pytest.approx(expected)
