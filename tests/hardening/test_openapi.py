"""/openapi.json: served by a real gateway, a valid OpenAPI 3.1 document, and complete: every path and
method the app routes (read from the app itself) has a description, so an endpoint added without one
fails here."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import jsonschema
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.routing import Mount, Route

from gateway.api.openai import HOT_PATHS
from gateway.app import create_app
from gateway.values.auth import digest_of
from tests.conftest import Gateway, Upstreams, policy_yaml, running_gateway

PATH_PARAM = re.compile(r"\{(\w+)(:\w+)?\}")  # Starlette's {name:converter} is OpenAPI's {name}


def routed() -> set[tuple[str, str]]:
    """(method, path) of everything the app answers, from its router and its hot paths."""
    app = create_app(lambda: None)  # type: ignore[arg-type,return-value]  # the lifespan never runs
    pairs = {("post", path) for path in HOT_PATHS}
    for route in app.app.routes:
        if isinstance(route, Route):
            for method in route.methods or ():
                if method != "HEAD":  # Starlette adds HEAD to every GET
                    pairs.add((method.lower(), PATH_PARAM.sub(r"{\1}", route.path)))
        elif isinstance(route, Mount):
            pairs.add(("get", route.path + "/{path}"))
        else:
            raise AssertionError(f"a kind of route this test does not know: {route!r}")
    return pairs


def described(document: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in document["paths"].items() for method in item}


def test_the_description_lists_every_endpoint_the_app_routes(gateway: Gateway) -> None:
    response = httpx.get(gateway.url + "/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    missing = routed() - described(document)
    assert not missing, f"endpoints the app routes but /openapi.json does not describe: {sorted(missing)}"
    extra = described(document) - routed()
    assert not extra, f"described but not routed: {sorted(extra)}"


def test_the_description_is_valid_openapi_3_1(gateway: Gateway) -> None:
    document = httpx.get(gateway.url + "/openapi.json", timeout=30).json()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    for name, schema in document["components"]["schemas"].items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise AssertionError(f"components.schemas.{name} is not a valid JSON Schema: {exc}") from None
    # Every $ref resolves within the document.
    refs = set(re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', response_text(gateway)))
    assert refs <= set(document["components"]["schemas"])
    # The doors' requests name the running policy's routes.
    chat = document["components"]["schemas"]["ChatRequest"]
    assert set(chat["properties"]["model"]["enum"]) == set(gateway.runtime.policy.routes)
    assert chat["required"] == ["model", "messages"]
    assert document["components"]["schemas"]["MessagesRequest"]["required"] == [
        "model",
        "max_tokens",
        "messages",
    ]


def response_text(gateway: Gateway) -> str:
    return httpx.get(gateway.url + "/openapi.json", timeout=30).text.replace('":"', '": "')


@pytest.fixture
def keyed_gateway(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEST_PAID_API_KEY", "unused")
    path = tmp_path / "policy.yaml"
    user, admin = "gwk-openapi-user-key", "gwk-openapi-admin-key"
    keys = f"""
auth:
  keys:
    - {{name: app, sha256: {digest_of(user)}, routes: [vllm-only]}}
    - {{name: ops, sha256: {digest_of(admin)}, admin: true}}
"""
    path.write_text(policy_yaml(upstreams) + keys)
    with running_gateway(path) as gateway:
        yield gateway, user, admin


def test_with_keys_the_description_needs_a_key_and_names_only_the_keys_routes(keyed_gateway) -> None:
    gateway, user, admin = keyed_gateway
    assert httpx.get(gateway.url + "/openapi.json", timeout=30).status_code == 401
    mine = httpx.get(gateway.url + "/openapi.json", headers={"authorization": f"Bearer {user}"}, timeout=30)
    assert mine.status_code == 200
    document = mine.json()
    assert document["components"]["schemas"]["ChatRequest"]["properties"]["model"]["enum"] == ["vllm-only"]
    assert set(document["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert document["paths"]["/admin/policy"]["get"]["security"]
    assert document["paths"]["/health"]["get"]["security"] == []
    # And what it says holds: admin endpoints refuse a user key and take the admin key.
    for path in ("/admin/policy", "/admin/backends", "/dashboard/data", "/metrics"):
        assert httpx.get(gateway.url + path, timeout=30).status_code == 401
        assert httpx.get(gateway.url + path, headers={"x-api-key": user}, timeout=30).status_code == 403
        assert httpx.get(gateway.url + path, headers={"x-api-key": admin}, timeout=30).status_code == 200
