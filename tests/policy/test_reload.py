"""Hot reload: valid edits are installed, invalid ones rejected with file:line while the old policy serves."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import PolicyError
from gateway.policy.reload import PolicyHolder
from tests.conftest import running_gateway

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
"""
WITH_BATCH_ROUTE = POLICY + "  kimi-k3-batch:\n    backends: [pool]\n"
INVALID = POLICY + "    slo: {ttft_p95_ms: -5}\n"  # line 10
INVALID_LINE = "10:11 routes.kimi-k3.slo.ttft_p95_ms: Input should be greater than 0"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def holder_for(tmp_path: Path, text: str = POLICY, **kwargs: object) -> tuple[PolicyHolder, Path]:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return PolicyHolder(path, environ={}, **kwargs), path  # type: ignore[arg-type]


def error_state(holder: PolicyHolder) -> tuple[str | None, float | None]:
    return holder.last_error, holder.last_error_at


def test_a_bad_policy_never_starts(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(INVALID)
    with pytest.raises(PolicyError, match=INVALID_LINE):
        PolicyHolder(path)
    with pytest.raises(PolicyError, match="cannot read"):
        PolicyHolder(tmp_path / "missing.yaml")


def test_unchanged_file_installs_nothing(tmp_path: Path) -> None:
    holder, _ = holder_for(tmp_path)
    first = holder.current
    assert holder.reload_now() is False
    assert holder.current is first and holder.reloads == 0 and holder.reload_failures == 0


def test_valid_edit_is_installed_and_listeners_hear_it(tmp_path: Path) -> None:
    heard: list[CompiledPolicy] = []
    holder, path = holder_for(tmp_path, on_change=[heard.append])
    path.write_text(WITH_BATCH_ROUTE)
    assert holder.reload_now() is True
    assert list(holder.current.routes) == ["kimi-k3", "kimi-k3-batch"]
    assert heard == [holder.current]
    assert holder.reloads == 1 and holder.last_error is None


def test_invalid_edit_keeps_the_running_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    holder, path = holder_for(tmp_path, clock=clock)
    running = holder.current
    path.write_text(INVALID)
    clock.now = 1234.5
    with caplog.at_level(logging.ERROR, logger="gateway.policy"):
        assert holder.reload_now() is False
    assert holder.current is running
    assert holder.last_error == f"{path}:{INVALID_LINE}"
    assert holder.last_error_at == 1234.5
    assert holder.reload_failures == 1 and holder.reloads == 0
    [record] = [r for r in caplog.records if r.name == "gateway.policy"]
    assert record.levelno == logging.ERROR and f"{path}:{INVALID_LINE}" in record.getMessage()

    path.write_text(WITH_BATCH_ROUTE)  # fixing the file clears the error
    assert holder.reload_now() is True
    assert error_state(holder) == (None, None)
    assert "kimi-k3-batch" in holder.current.routes and holder.reload_failures == 1


def test_a_deleted_file_is_a_failed_reload(tmp_path: Path) -> None:
    holder, path = holder_for(tmp_path)
    running = holder.current
    path.unlink()
    assert holder.reload_now() is False
    assert holder.current is running
    assert holder.last_error == f"{path}: cannot read the policy file: No such file or directory"


def test_a_failing_listener_does_not_stop_the_others(tmp_path: Path) -> None:
    heard: list[str] = []

    def broken(policy: CompiledPolicy) -> None:
        raise RuntimeError("listener bug")

    holder, path = holder_for(tmp_path, on_change=[broken])
    holder.subscribe(lambda policy: heard.append(policy.digest))
    path.write_text(WITH_BATCH_ROUTE)
    assert holder.reload_now() is True
    assert heard == [holder.current.digest]


def replace_file(path: Path, text: str) -> None:
    """Write as editors and ConfigMaps do, in one rename, so the watcher never sees half a file."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for the watcher; the bound only stops a broken test from hanging."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the watcher never got there")


async def test_watch_picks_up_edits_and_rejects_bad_ones_once(tmp_path: Path) -> None:
    holder, path = holder_for(tmp_path)
    watcher = asyncio.create_task(holder.watch(interval_s=0.01))
    try:
        replace_file(path, WITH_BATCH_ROUTE)
        await until(lambda: "kimi-k3-batch" in holder.current.routes)
        assert holder.reloads == 1

        good = holder.current
        replace_file(path, INVALID)
        await until(lambda: holder.reload_failures == 1)
        os.utime(path)  # touched but not changed: the same bad content is not reported again
        await asyncio.sleep(0.05)
        assert holder.reload_failures == 1 and holder.current is good

        replace_file(path, POLICY)
        await until(lambda: holder.reloads == 2)
        assert list(holder.current.routes) == ["kimi-k3"]
    finally:
        watcher.cancel()


async def test_watch_follows_a_configmap_symlink_swap(tmp_path: Path) -> None:
    # Kubernetes mounts a ConfigMap as policy.yaml -> ..data/policy.yaml, ..data -> ..<timestamp>/,
    # and updates it by pointing ..data at a new directory in one rename.
    first, second = tmp_path / "..2024_01", tmp_path / "..2024_02"
    first.mkdir()
    second.mkdir()
    (first / "policy.yaml").write_text(POLICY)
    (second / "policy.yaml").write_text(WITH_BATCH_ROUTE)
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "policy.yaml").symlink_to("..data/policy.yaml")
    holder = PolicyHolder(tmp_path / "policy.yaml", environ={})
    watcher = asyncio.create_task(holder.watch(interval_s=0.01))
    try:
        (tmp_path / "..data_tmp").symlink_to(second.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        await until(lambda: "kimi-k3-batch" in holder.current.routes)
    finally:
        watcher.cancel()


def test_the_reload_endpoint_answers_422_with_the_errors_and_200_only_when_the_new_policy_runs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    # No polling: every reload below is the endpoint's own.
    with running_gateway(path, policy_poll_s=3600) as gateway:
        reload_url = gateway.url + "/admin/policy/reload"
        running = gateway.runtime.policy.digest
        path.write_text(INVALID)
        rejected = httpx.post(reload_url)
        assert rejected.status_code == 422
        error = rejected.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "policy_rejected"
        assert error["errors"] == [f"{path}:{INVALID_LINE}"]
        assert f"still serving sha256 {running[:12]}" in error["message"]
        assert gateway.runtime.policy.digest == running, "the last good policy serves on"
        assert httpx.post(reload_url).status_code == 422, "asked again, the file is judged again"

        path.write_text(WITH_BATCH_ROUTE)
        installed = httpx.post(reload_url)
        assert installed.status_code == 200 and installed.headers["x-gateway-policy-changed"] == "true"
        assert installed.json()["routes"] == ["kimi-k3", "kimi-k3-batch"]
        again = httpx.post(reload_url)
        assert again.status_code == 200 and again.headers["x-gateway-policy-changed"] == "false"

        path.unlink()
        gone = httpx.post(reload_url)
        assert gone.status_code == 422 and str(path) in gone.json()["error"]["errors"][0]
