"""auth.keys_file: client keys from a file of their own (a mounted Kubernetes Secret), merged with the
policy's, re-read on every reload, and a missing file adds none."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.policy.load import PolicyError, load_policy
from gateway.policy.reload import PolicyHolder
from gateway.values.auth import policy_line

POLICY = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing: {gpu_hours: {usd_per_hour: 62.93}}
routes:
  kimi-k3:
    backends: [pool]
auth:
  keys_file: secret/keys.yaml
"""


def keys_yaml(*names: str) -> str:
    return "keys:\n" + "".join(f"  {policy_line(n, 'sk-' + n, routes=[], admin=False)}\n" for n in names)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def write(tmp_path: Path, keys: str | None) -> Path:
    (tmp_path / "secret").mkdir(exist_ok=True)
    if keys is not None:
        (tmp_path / "secret" / "keys.yaml").write_text(keys)
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


def test_keys_come_from_the_file_beside_the_policy(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, keys_yaml("app", "ops")), environ={})
    assert {k.name for k in policy.api_keys.values()} == {"app", "ops"}
    assert policy.api_keys[digest("sk-app")].name == "app"
    assert policy.keys_file == str(tmp_path / "secret" / "keys.yaml")


def test_a_missing_keys_file_adds_no_keys_and_warns(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, None), environ={})
    assert policy.api_keys == {}
    assert any("keys.yaml does not exist" in w for w in policy.warnings)


def test_a_bad_keys_file_is_refused_naming_its_line(tmp_path: Path) -> None:
    bad = keys_yaml("app") + "  - {name: ops, sha256: not-hex}\n"
    with pytest.raises(PolicyError, match=r"keys\.yaml:3:\d+ keys\[1\]\.sha256"):
        load_policy(write(tmp_path, bad), environ={})
    with pytest.raises(PolicyError, match=r"twice|duplicate"):
        load_policy(write(tmp_path, keys_yaml("app", "app")), environ={})


def test_rotating_the_keys_file_alone_is_a_reload(tmp_path: Path) -> None:
    path = write(tmp_path, keys_yaml("app"))
    holder = PolicyHolder(path, environ={})
    assert holder.reload_now() is False, "nothing changed"
    (tmp_path / "secret" / "keys.yaml").write_text(keys_yaml("app2"))
    assert holder.reload_now() is True
    assert {k.name for k in holder.current.api_keys.values()} == {"app2"}
    assert holder.reload_now() is False
    (tmp_path / "secret" / "keys.yaml").write_text("keys: [oops\n")
    assert isinstance(holder.reload_checked(), PolicyError)
    assert {k.name for k in holder.current.api_keys.values()} == {"app2"}, "the last good keys serve"
