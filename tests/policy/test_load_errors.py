"""Every kind of policy problem is reported as ``file:line:col dotted.path: message``, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.load import PolicyError, PolicyFileUnreadable, compile_policy_text, load_policy

SOURCE = "policies/x.yaml"

BACKEND_KEYS = (
    "api_key_env, context_window, dialect, expected_ttft_ms, family, forward_user, max_concurrency, "
    "max_connections, model, prefix_cache, pricing, resume, scaling, signals, system_messages, thinking, "
    "timeouts, tls, trace_context, trust_env, url"
)


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        compile_policy_text(text, SOURCE, environ={})
    assert str(caught.value) == "\n".join(str(p) for p in caught.value.problems)
    return str(caught.value).splitlines()


def test_unknown_key_names_the_allowed_keys_and_a_likely_typo() -> None:
    text = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    modle: m2
    pricing:
      gpu_hours: {usd_per_hour: 1}
routes:
  r:
    backends: [pool]
"""
    assert problems(text) == [
        f"policies/x.yaml:6:5 backends.pool.modle: unknown key (did you mean 'model'?); "
        f"expected one of: {BACKEND_KEYS}"
    ]


def test_bad_types_and_out_of_range_numbers() -> None:
    text = """\
backends:
  pool:
    dialect: tgi
    url: http://127.0.0.1:9/v1
    model: m
    max_concurrency: "8"
    pricing:
      per_token:
        input_usd_per_mtok: 0.6
        output_usd_per_mtok: -15
routes:
  kimi-k3:
    backends: [pool]
    slo:
      ttft_p95_ms: 0
      min_decode_tokens_per_s: fast
"""
    assert problems(text) == [
        "policies/x.yaml:3:5 backends.pool.dialect: "
        "Input should be 'vllm', 'llamacpp', 'openai', 'sglang' or 'litellm'",
        "policies/x.yaml:6:5 backends.pool.max_concurrency: Input should be a valid integer",
        "policies/x.yaml:10:9 backends.pool.pricing.per_token.output_usd_per_mtok: "
        "Input should be greater than or equal to 0",
        "policies/x.yaml:15:7 routes.kimi-k3.slo.ttft_p95_ms: Input should be greater than 0",
        "policies/x.yaml:16:7 routes.kimi-k3.slo.min_decode_tokens_per_s: Input should be a valid number",
    ]


def test_dangling_and_repeated_backend_references_point_at_the_list_item() -> None:
    text = """\
backends:
  b300-vllm:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {gpu_hours: {usd_per_hour: 62.93}}
routes:
  kimi-k3:
    backends:
      - b300-vllm
      - b300-vlm
      - b300-vllm
"""
    assert problems(text) == [
        "policies/x.yaml:11:9 routes.kimi-k3.backends[1]: unknown backend 'b300-vlm' "
        "(did you mean 'b300-vllm'?); defined backends: b300-vllm",
        "policies/x.yaml:12:9 routes.kimi-k3.backends[2]: backend 'b300-vllm' is listed twice",
    ]


def test_missing_pricing_points_at_the_backend() -> None:
    text = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
routes:
  r:
    backends: [pool]
"""
    assert problems(text) == ["policies/x.yaml:2:3 backends.pool.pricing: required key is missing"]


def test_missing_top_level_section_points_at_the_document() -> None:
    text = """\
# comment
backends:
  pool: {dialect: vllm, url: http://h/v1, model: m, pricing: {gpu_hours: {usd_per_hour: 1}}}
"""
    assert problems(text) == ["policies/x.yaml:2:1 routes: required key is missing"]


def test_two_pricing_bases_are_one_too_many() -> None:
    text = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing:
      gpu_hours: {usd_per_hour: 62.93}
      per_token: {input_usd_per_mtok: 1, output_usd_per_mtok: 2}
routes:
  r:
    backends: [pool]
"""
    assert problems(text) == [
        "policies/x.yaml:6:5 backends.pool.pricing: "
        "give exactly one pricing basis: per_token, litellm or gpu_hours"
    ]


def test_yaml_syntax_error_has_a_position() -> None:
    text = """\
backends:
  pool: [a, b
routes:
  r: {}
"""
    assert problems(text) == [
        "policies/x.yaml:3:7: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence started at line 2)"
    ]


def test_duplicate_key_names_both_places() -> None:
    text = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    dialect: llamacpp
routes:
  r:
    backends: [pool]
"""
    assert problems(text) == [
        "policies/x.yaml:5:5 backends.pool.dialect: duplicate key (first defined at line 3)"
    ]


def test_unknown_litellm_model_is_an_error_at_load() -> None:
    text = """\
backends:
  api:
    dialect: openai
    url: https://api.example.invalid/v1
    model: kimi-k3
    pricing:
      litellm:
        model: moonshot/kimi-k33
routes:
  r:
    backends: [api]
"""
    assert problems(text) == [
        "policies/x.yaml:8:9 backends.api.pricing.litellm.model: unknown model 'moonshot/kimi-k33' "
        "in litellm's price map (did you mean 'moonshot/kimi-k3'?)"
    ]


def test_non_finite_numbers_and_bad_signal_urls() -> None:
    text = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {gpu_hours: {usd_per_hour: .inf}}
  other:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {gpu_hours: {usd_per_hour: 1}}
    signals: {metrics_url: 127.0.0.1:9/metrics}
routes:
  r:
    backends: [pool, other]
"""
    assert problems(text) == [
        "policies/x.yaml:6:27 backends.pool.pricing.gpu_hours.usd_per_hour: Input should be a finite number",
        "policies/x.yaml:12:15 backends.other.signals.metrics_url: "
        "Input should be an http:// or https:// URL",
    ]


def test_a_document_that_is_not_a_mapping() -> None:
    assert problems("") == ["policies/x.yaml:1:1: expected a mapping with `backends:` and `routes:`"]
    assert problems("- a\n") == ["policies/x.yaml:1:1: expected a mapping with `backends:` and `routes:`"]


def test_invalid_utf8_and_unreadable_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"backends:\n  caf\xe9: {}\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(bad)
    assert str(caught.value) == f"{bad}:2:6: not valid UTF-8"

    missing = tmp_path / "missing.yaml"
    with pytest.raises(PolicyFileUnreadable) as unreadable:
        load_policy(missing)
    assert str(unreadable.value) == f"{missing}: cannot read the policy file: No such file or directory"
