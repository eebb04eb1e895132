"""A valid policy compiles to USD-per-token prices, resolved routes and credentials from the environment."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.compiled import CompiledPolicy, PoolPrice, TokenPrices
from gateway.policy.load import PolicyError, compile_policy_text, load_policy

POLICY = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1/
    model: moonshotai/Kimi-K3
    thinking: mandatory
    pricing:
      gpu_hours: {usd_per_hour: 62.93, accounting: marginal, assumed_tokens_per_s: 92}
  api:
    dialect: openai
    url: http://127.0.0.1:9/v1
    model: kimi-k3
    api_key_env: TEST_POLICY_KEY
    pricing:
      per_token:
        input_usd_per_mtok: 0.60
        cached_input_usd_per_mtok: 0.15
        output_usd_per_mtok: 15
  priced-apart:
    dialect: openai
    url: http://127.0.0.1:9/v1
    model: other
    pricing:
      per_token: {input_usd_per_mtok: 2, output_usd_per_mtok: 8, reasoning_usd_per_mtok: 4}
routes:
  kimi-k3:
    backends: [pool, api, priced-apart]
    slo: {ttft_p95_ms: 3000, min_decode_tokens_per_s: 20}
    when_infeasible: reject
"""


def test_per_token_prices_become_usd_per_token() -> None:
    policy = compile_policy_text(POLICY, "p.yaml", environ={"TEST_POLICY_KEY": "sk-test"})
    api = policy.backends["api"]
    prices = api.token_prices
    assert isinstance(prices, TokenPrices)  # fields compared apart: a compiled TokenPrices takes only floats
    assert (prices.input, prices.cached_input) == (pytest.approx(0.6e-6), pytest.approx(0.15e-6))
    assert prices.output == prices.reasoning == pytest.approx(15e-6)  # thinking billed as output
    assert api.pool_price is None and api.price_source == "per_token"
    apart = policy.backends["priced-apart"].token_prices
    assert apart is not None
    assert apart.cached_input == pytest.approx(2e-6)  # no cached price: cached input costs as input
    assert apart.reasoning == pytest.approx(4e-6)


def test_gpu_hours_become_a_pool_price() -> None:
    pool = compile_policy_text(POLICY, "p.yaml", environ={}).backends["pool"]
    assert pool.pool_price == PoolPrice(usd_per_hour=62.93, accounting="marginal", assumed_tokens_per_s=92.0)
    assert pool.token_prices is None and pool.price_source == "gpu_hours"


def test_backend_and_route_fields() -> None:
    policy = compile_policy_text(POLICY, "p.yaml", environ={"TEST_POLICY_KEY": "sk-test"})
    pool, api = policy.backends["pool"], policy.backends["api"]
    assert pool.base_url == "http://127.0.0.1:9/v1"  # trailing slash stripped
    assert (pool.name, pool.dialect, pool.model, pool.thinking) == (
        "pool",
        "vllm",
        "moonshotai/Kimi-K3",
        "mandatory",
    )
    assert api.api_key == "sk-test" and "sk-test" not in repr(api)
    route = policy.routes["kimi-k3"]
    assert route.backends == ("pool", "api", "priced-apart")
    assert (route.slo.ttft_p95_ms, route.slo.min_decode_tokens_per_s) == (3000, 20)
    assert (route.objective, route.when_infeasible, route.fallback.max_attempts) == (
        "lowest_cost",
        "reject",
        3,
    )
    assert policy.max_body_bytes == 4 * 1024 * 1024
    assert policy.warnings == ()
    with pytest.raises(TypeError):
        policy.routes["other"] = route  # type: ignore[index]


def test_unset_api_key_env_is_a_warning_not_an_error() -> None:
    policy = compile_policy_text(POLICY, "p.yaml", environ={})
    assert policy.backends["api"].api_key is None
    assert policy.warnings == (
        "p.yaml:13:5 backends.api.api_key_env: environment variable TEST_POLICY_KEY is not set; "
        "requests go without a key",
    )


def test_unused_backend_is_a_warning() -> None:
    text = POLICY.replace("backends: [pool, api, priced-apart]", "backends: [pool, api]")
    policy = compile_policy_text(text, "p.yaml", environ={"TEST_POLICY_KEY": "k"})
    assert policy.warnings == ("p.yaml:19:3 backends.priced-apart: not used by any route",)


def test_digest_is_the_sha256_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    policy = load_policy(path, environ={})
    assert policy.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert policy.source == str(path)
    assert compile_policy_text(POLICY, str(path), environ={}).digest == policy.digest


def test_litellm_price_is_looked_up_offline() -> None:
    text = """\
backends:
  api:
    dialect: openai
    url: https://api.example.invalid/v1
    model: kimi-k3
    pricing:
      litellm: {model: moonshot/kimi-k3}
routes:
  r: {backends: [api]}
"""
    backend = compile_policy_text(text, "p.yaml", environ={}).backends["api"]
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    import litellm

    entry = litellm.model_cost["moonshot/kimi-k3"]
    assert backend.price_source == "litellm:moonshot/kimi-k3"
    assert backend.token_prices == TokenPrices(
        input=entry["input_cost_per_token"],
        cached_input=entry["cache_read_input_token_cost"],
        output=entry["output_cost_per_token"],
        reasoning=entry["output_cost_per_token"],
    )
    assert backend.token_prices.output * 1e6 == pytest.approx(15.0)


def test_litellm_entries_without_token_prices_are_errors() -> None:
    text = """\
backends:
  doc:
    dialect: openai
    url: https://api.example.invalid/v1
    model: m
    pricing: {litellm: {model: sample_spec}}
  empty:
    dialect: openai
    url: https://api.example.invalid/v1
    model: m
    pricing: {litellm: {model: databricks/system.ai.kimi-k3}}
routes:
  r: {backends: [doc, empty]}
"""
    with pytest.raises(PolicyError) as caught:
        compile_policy_text(text, "p.yaml", environ={})
    assert str(caught.value).splitlines() == [
        "p.yaml:6:25 backends.doc.pricing.litellm.model: unknown model 'sample_spec' in litellm's price map",
        "p.yaml:11:25 backends.empty.pricing.litellm.model: litellm's price map has no usable "
        "input_cost_per_token for 'databricks/system.ai.kimi-k3'",
    ]


def test_litellm_is_imported_only_for_policies_that_use_it() -> None:
    code = (
        "import sys; from gateway.policy.load import load_policy; load_policy('policies/default.yaml'); "
        "print('litellm' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def shipped_policies() -> list[Path]:
    root = Path(__file__).resolve().parents[2] / "policies"
    return sorted(root.rglob("*.yaml"))


@pytest.mark.parametrize("path", shipped_policies(), ids=lambda p: p.name)
def test_shipped_policies_load(path: Path) -> None:
    policy = load_policy(path, environ={})
    assert policy.routes and policy.backends


def test_default_policy_is_the_three_tier_kimi_setup() -> None:
    root = Path(__file__).resolve().parents[2]
    policy = load_policy(root / "policies" / "default.yaml", environ={"PAID_API_KEY": "k"})
    assert list(policy.routes) == ["kimi-k3", "kimi-k3-batch", "kimi-k3-fast", "embeddings"]
    assert policy.routes["kimi-k3"].backends == ("b300-vllm", "a100-llamacpp", "paid-api")
    assert [b.base_url for b in policy.backends.values()] == [
        "http://127.0.0.1:8101/v1",
        "http://127.0.0.1:8102/v1",
        "http://127.0.0.1:8103/v1",
    ]
    b300, a100 = policy.backends["b300-vllm"].pool_price, policy.backends["a100-llamacpp"].pool_price
    assert b300 is not None and a100 is not None and b300.assumed_tokens_per_s and a100.assumed_tokens_per_s
    # The published figures: $62.93/h at 92 tok/s is ~$190/1M; $20.09/h at 9 tok/s is ~$620/1M.
    assert b300.usd_per_hour / (b300.assumed_tokens_per_s * 3600) * 1e6 == pytest.approx(190, rel=0.01)
    assert a100.usd_per_hour / (a100.assumed_tokens_per_s * 3600) * 1e6 == pytest.approx(620, rel=0.01)
    paid = policy.backends["paid-api"].token_prices
    assert paid is not None and paid.output * 1e6 == pytest.approx(15.0)
    assert policy.backends["paid-api"].api_key == "k"


class FixedPolicy:
    def __init__(self, policy: CompiledPolicy) -> None:
        self.current = policy


def test_tuning_defaults_reach_the_compiled_policy() -> None:
    policy = compile_policy_text(POLICY, "p.yaml", environ={})
    assert policy.tuning.circuit.failure_threshold == 5 and policy.tuning.chars_per_token == 4.0
    assert policy.backends["pool"].prior_output_tokens == 1000.0  # mandatory thinking
    assert policy.backends["api"].prior_output_tokens == 400.0


def test_tuning_overrides_reach_the_runtime_and_the_decision(tmp_path: Path) -> None:
    from gateway.runtime import Runtime

    tuning = """tuning:
  circuit: {failure_threshold: 2, base_cooldown_s: 3, max_cooldown_s: 5}
  stats: {half_life_s: 10, window: 32}
  prior_output_tokens: {mandatory: 3000}
  chars_per_token: 3
"""
    policy = compile_policy_text(POLICY + tuning, "p.yaml", environ={})
    assert policy.backends["pool"].prior_output_tokens == 3000.0
    assert policy.tuning.chars_per_token == 3.0
    runtime = Runtime(FixedPolicy(policy), ledger_path=tmp_path / "ledger.sqlite3")
    assert (runtime.stats.half_life_s, runtime.stats.window) == (10.0, 32)
    assert runtime.stats.circuit("pool").cooldown_s == 3.0
    decision = runtime.explain(policy.routes["kimi-k3"], 100, None)
    pool = next(e for e in decision.evals if e.backend == "pool")
    assert pool.predicted_output_tokens == 3000.0


def test_tuning_errors_name_the_field() -> None:
    bad = POLICY + "tuning:\n  circuit: {base_cooldown_s: 10, max_cooldown_s: 5}\n"
    with pytest.raises(PolicyError, match=r"tuning\.circuit"):
        compile_policy_text(bad, "p.yaml", environ={})


def test_streams_resume_by_default_where_every_candidate_serves_one_family() -> None:
    policy = load_policy(Path(__file__).resolve().parents[2] / "policies" / "default.yaml")
    assert policy.backends["b300-vllm"].resume == "continue_final_message"  # the vllm default
    assert policy.backends["a100-llamacpp"].resume == "continue_final_message"  # llama-server takes it too
    assert policy.backends["paid-api"].resume == "partial"
    assert all(route.resume_streams for route in policy.routes.values())
    # Different models by default (family = model): no resume unless the policy turns it on.
    plain = compile_policy_text(POLICY, "p.yaml", environ={})
    assert {b.family for b in plain.backends.values()} == {"moonshotai/Kimi-K3", "kimi-k3", "other"}
    assert plain.routes["kimi-k3"].resume_streams is False
    forced = compile_policy_text(
        POLICY.replace(
            "when_infeasible: reject", "when_infeasible: reject\n    fallback: {resume_streams: true}"
        ),
        "p.yaml",
        environ={},
    )
    assert forced.routes["kimi-k3"].resume_streams is True
