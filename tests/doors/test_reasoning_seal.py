"""Sealed reasoning bound to its caller and its age, over HTTP to a gateway with two API keys: a blob
sealed in key A's answer opens in A's next request and is left out of key B's (with the note an altered
blob gets, never an error), as is a blob past its age; a rotated secret's blobs open while it is named
in ``GATEWAY_REASONING_KEY_PREVIOUS``; and ``gateway serve`` refuses to start with a short secret."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.doors.reasoning_seal import (
    KEY_ENV,
    MAX_AGE_S,
    MIN_SECRET_CHARS,
    PREVIOUS_KEY_ENV,
    Keyring,
    ensure_key,
)
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway
from tests.doors.ledger import ANSWER, THINKING

SECRET = "the current reasoning secret, 32+ characters"
OLD_SECRET = "the previous reasoning secret, 32+ characters"
KEY_A, KEY_B = "sk-caller-a", "sk-caller-b"
INCLUDE = ["reasoning.encrypted_content"]
LEFT_OUT = "reasoning item(s) not sealed by this gateway"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def gateway(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.delenv(PREVIOUS_KEY_ENV, raising=False)
    path = tmp_path / "policy.yaml"
    keys = "".join(
        f"    - {{name: {name}, sha256: {digest(key)}}}\n" for name, key in (("a", KEY_A), ("b", KEY_B))
    )
    path.write_text(policy_yaml(upstreams) + "auth:\n  keys:\n" + keys)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def post(gateway: Gateway, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gateway.base_url + "/responses",
        json={"model": "vllm-only", "store": False, **body},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def history_with(blob: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "think"},
        {"type": "reasoning", "summary": [], "encrypted_content": blob},
        {"type": "message", "role": "assistant", "content": ANSWER},
        {"role": "user", "content": "again"},
    ]


def reasoning_upstream(upstreams: Upstreams) -> list[Any]:
    """The reasoning the last upstream request carried back to the model, per assistant turn."""
    requests = httpx.get(upstreams.vllm.url + "/emulator/requests").json()
    body = [r["body"] for r in requests if r["path"].endswith("/chat/completions")][-1]
    return [m.get("reasoning_content") for m in body["messages"] if m["role"] == "assistant"]


def test_a_blob_sealed_for_key_a_opens_for_a_and_not_for_b(gateway: Gateway, upstreams: Upstreams) -> None:
    first = post(gateway, KEY_A, {"input": "think", "include": INCLUDE})
    assert first.status_code == 200, first.text
    blob = first.json()["output"][0]["encrypted_content"]
    assert blob and THINKING not in blob
    mine = post(gateway, KEY_A, {"input": history_with(blob), "include": INCLUDE})
    assert mine.status_code == 200 and "x-gateway-notes" not in mine.headers
    assert reasoning_upstream(upstreams) == [THINKING]
    theirs = post(gateway, KEY_B, {"input": history_with(blob), "include": INCLUDE})
    assert theirs.status_code == 200  # left out with a note, as an altered blob is: never an error
    assert LEFT_OUT in theirs.headers["x-gateway-notes"]
    assert reasoning_upstream(upstreams) == [None]


def test_a_blob_past_its_age_is_left_out(gateway: Gateway, upstreams: Upstreams) -> None:
    def sealed_ago(seconds: float) -> str:
        return Keyring(SECRET).for_caller(digest(KEY_A), clock=lambda: time.time() - seconds).seal(THINKING)

    fresh = post(gateway, KEY_A, {"input": history_with(sealed_ago(MAX_AGE_S - 3600))})
    assert fresh.status_code == 200 and "x-gateway-notes" not in fresh.headers
    assert reasoning_upstream(upstreams) == [THINKING]
    expired = post(gateway, KEY_A, {"input": history_with(sealed_ago(MAX_AGE_S + 60))})
    assert expired.status_code == 200 and LEFT_OUT in expired.headers["x-gateway-notes"]
    assert reasoning_upstream(upstreams) == [None]


def test_the_previous_secret_opens_blobs_while_it_is_named(
    gateway: Gateway, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = Keyring(OLD_SECRET).for_caller(digest(KEY_A)).seal(THINKING)
    assert LEFT_OUT in post(gateway, KEY_A, {"input": history_with(blob)}).headers["x-gateway-notes"]
    monkeypatch.setenv(PREVIOUS_KEY_ENV, OLD_SECRET)  # the rotation: the old secret still opens
    during = post(gateway, KEY_A, {"input": history_with(blob), "include": INCLUDE})
    assert during.status_code == 200 and "x-gateway-notes" not in during.headers
    assert reasoning_upstream(upstreams) == [THINKING]
    resealed = during.json()["output"][0]["encrypted_content"]  # new blobs: under the new secret
    assert Keyring(SECRET).for_caller(digest(KEY_A)).open(resealed) == THINKING
    assert Keyring(OLD_SECRET).for_caller(digest(KEY_A)).open(resealed) is None


def test_a_blob_of_the_first_format_is_left_out(gateway: Gateway) -> None:
    """A blob of the unbound format (``gw1:``) no longer opens: its key was a bare SHA-256."""
    reply = post(gateway, KEY_A, {"input": history_with("gw1:" + "A" * 80)})
    assert reply.status_code == 200 and LEFT_OUT in reply.headers["x-gateway-notes"]


def test_serve_refuses_to_start_with_a_short_secret(tmp_path: Path, upstreams: Upstreams) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(upstreams))
    env = {"PATH": "/usr/bin:/bin", KEY_ENV: "short", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"{KEY_ENV} is 5 characters" in done.stderr and f"at least {MIN_SECRET_CHARS}" in done.stderr


def test_a_short_previous_secret_is_refused_too() -> None:
    problem = ensure_key({KEY_ENV: SECRET, PREVIOUS_KEY_ENV: "old"})
    assert problem is not None and problem.startswith(f"{PREVIOUS_KEY_ENV} is 3 characters")
    assert ensure_key({KEY_ENV: SECRET, PREVIOUS_KEY_ENV: OLD_SECRET}) is None
