"""The commands a user types: `gateway check` judges policies, `--version` and `--help` answer,
`gateway serve` says "serving" only once it listens and fails in one line on a busy port."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from gateway import native
from gateway.cli import build_parser, main
from tests.servers import ProcessServer, free_port, python_module

REPO = Path(__file__).resolve().parent.parent


def test_check_prints_routes_for_a_valid_policy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(REPO / "policies" / "default.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "route kimi-k3" in result.stdout and "b300-vllm" in result.stdout


def test_check_names_file_line_and_path_for_an_invalid_policy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (REPO / "policies" / "default.yaml").read_text()
    bad.write_text(text.replace("ttft_p95_ms: 3000", "ttft_p95_ms: -3"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(bad)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    line = next(i for i, row in enumerate(bad.read_text().splitlines(), 1) if "ttft_p95_ms: -3" in row)
    assert f"{bad}:{line}:" in result.stdout and "routes.kimi-k3.slo.ttft_p95_ms" in result.stdout


def test_serve_refuses_a_bad_policy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: {}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(bad), "--port", str(free_port())],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2 and "bad.yaml" in result.stderr


def gateway_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PAID_API_KEY": "set"}  # no policy warning before the line under test
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=env,
    )


def test_version_is_the_installed_packages() -> None:
    result = gateway_command("--version")
    # and which code runs: the compiled modules (gateway/native.py) or the .py files, and why
    assert result.returncode == 0 and result.stdout == f"gateway {version('gateway')}, {native.state}\n"


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*prefix, name)
                yield from subcommands(child, (*prefix, name))


def test_every_subcommands_help_shows_its_defaults_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    commands = list(subcommands(parser))
    assert {"serve", "demo", "spend", "check", "emulate", "keys", "keys create", "keys list"} <= {
        " ".join(c) for c in commands
    }
    for command in [(), *commands]:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
        assert "examples: gateway" in shown, command
        child = parser
        for name in command:
            child = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        for action in child._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert f"(default: {action.default})" in shown, (command, action.dest)
            elif action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, (command, action.dest)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_busy_port_fails_with_one_line_naming_it(workers: str, tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        ledger = str(tmp_path / "ledger.sqlite3")
        result = gateway_command("serve", "--port", str(port), "--workers", workers, "--ledger", ledger)
    assert result.returncode == 2
    *_, last = result.stderr.strip().splitlines()  # after any warning about the policy or workers
    assert last == (
        f"gateway: cannot listen on 127.0.0.1:{port}: address already in use; is another gateway or demo "
        "running? pick another with --port"
    )
    assert "Traceback" not in result.stderr and "Errno" not in result.stderr
    assert "serving" not in result.stdout + result.stderr


def test_serve_says_serving_once_it_listens_and_names_its_ledger(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    args = ["serve", "--port", str(port), "--ledger", str(tmp_path / "spent.sqlite3")]
    server = ProcessServer(python_module("gateway", *args), log_path=str(log)).start()
    try:
        deadline = time.monotonic() + 60
        while "gateway serving on" not in log.read_text():
            assert time.monotonic() < deadline and server.proc is not None and server.proc.poll() is None
            time.sleep(0.05)
        # Said only once listening: the very next request is answered.
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert health.status_code == 200 and health.json()["version"] == version("gateway")
    finally:
        assert server.stop() == 0
    assert f"ledger: {tmp_path / 'spent.sqlite3'} (from --ledger)" in log.read_text()


def test_a_busy_metrics_port_is_named_with_its_flag(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ledger = str(tmp_path / "ledger.sqlite3")
        args = ("serve", "--port", str(free_port()), "--metrics-port", str(taken), "--ledger", ledger)
        result = gateway_command(*args)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{taken}: address already in use" in last and last.endswith("with --metrics-port")


def test_emulate_offers_every_emulator_profile() -> None:
    from gateway.cli import EMULATOR_PROFILES
    from gateway.emulator.profiles import PROFILES

    assert sorted(EMULATOR_PROFILES) == sorted(PROFILES)
