"""Route aliases: exact ids and globs reach their route, /v1/models still lists routes, and an alias
claimed twice is a load error with its file and line."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.policy.load import PolicyError, compile_policy_text, load_policy
from tests.conftest import Upstreams, policy_yaml, running_gateway

BACKENDS = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing:
      gpu_hours: {usd_per_hour: 1}
"""


def test_exact_ids_then_the_most_specific_glob_name_the_route() -> None:
    policy = compile_policy_text(
        BACKENDS
        + """\
routes:
  main:
    backends: [pool]
    aliases: ["claude-*", "gpt-*", "my-model"]
  small:
    backends: [pool]
    aliases: ["claude-haiku-*", "gpt-5.1-codex-mini"]
""",
        "p.yaml",
        environ={},
    )
    name_of = {model: getattr(policy.route_for(model), "name", None) for model in (
        "main", "small", "my-model", "claude-opus-4-8", "claude-haiku-4-5-20251001",
        "gpt-5.1-codex-mini", "gpt-5.1-codex", "other",
    )}  # fmt: skip
    assert name_of == {
        "main": "main",
        "small": "small",
        "my-model": "main",
        "claude-opus-4-8": "main",
        "claude-haiku-4-5-20251001": "small",  # the longer glob is the more specific
        "gpt-5.1-codex-mini": "small",  # an exact alias beats any glob
        "gpt-5.1-codex": "main",
        "other": None,
    }
    assert policy.routes["main"].aliases == ("claude-*", "gpt-*", "my-model")


def test_an_alias_claimed_twice_or_naming_a_route_is_refused_with_its_line() -> None:
    text = (
        BACKENDS
        + """\
routes:
  main:
    backends: [pool]
    aliases: ["claude-*"]
  other:
    backends: [pool]
    aliases: ["claude-*", "main"]
"""
    )
    with pytest.raises(PolicyError) as caught:
        compile_policy_text(text, "p.yaml", environ={})
    assert str(caught.value).splitlines() == [
        "p.yaml:14:15 routes.other.aliases[0]: alias 'claude-*' is already claimed by route 'main'",
        "p.yaml:14:27 routes.other.aliases[1]: alias 'main' is the name of route 'main'",
    ]


def test_the_default_policy_sends_the_agents_default_ids_to_its_main_route() -> None:
    policy = load_policy("policies/default.yaml")
    for model in ("claude-opus-4-8", "claude-haiku-4-5-20251001", "gpt-5.1-codex", "codex-mini-latest"):
        route = policy.route_for(model)
        assert route is not None and route.name == "kimi-k3", model


def test_a_client_naming_an_alias_is_served_by_the_route_and_models_lists_routes(
    upstreams: Upstreams, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    routes = """
  kimi-k3:
    backends: [b300-vllm]
    aliases: ["claude-*"]
"""
    path.write_text(policy_yaml(upstreams, routes))
    with running_gateway(path) as gateway:
        body = {"model": "claude-opus-4-8", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(gateway.url + "/v1/messages", json=body, timeout=30)
        assert answer.status_code == 200 and answer.headers["x-gateway-route"] == "kimi-k3"
        chat = {**body, "model": "claude-haiku-4-5"}
        assert httpx.post(gateway.base_url + "/chat/completions", json=chat, timeout=30).status_code == 200
        listed = httpx.get(gateway.base_url + "/models").json()["data"]
        assert [model["id"] for model in listed] == ["kimi-k3"]
