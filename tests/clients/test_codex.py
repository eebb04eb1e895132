"""OpenAI's Codex CLI, unmodified, against `gateway demo`: the README's provider block, default
features, `codex exec` with a tool round trip (the emulated model calls Codex's shell tool, Codex runs
it), then `codex exec resume` carrying the first turn's sealed reasoning back. Asserts on what Codex
printed, that no request was refused, and on the ledger rows. Codex talks to 127.0.0.1 only (no login,
update check, analytics or feedback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.clients.conftest import Demo, running_demo
from tests.doors.ledger import ANSWER
from tests.test_demo import readme_block

REPO = Path(__file__).resolve().parents[2]
# What Codex 0.171.0 asks for when its config names no model; for it, its tools come in an
# additional_tools item, namespaced, and its only way to run commands is `exec`, a custom tool.
CODEX_DEFAULT_MODEL = "gpt-6.2-sol"
OFFLINE = ("check_for_update_on_startup=false", "analytics.enabled=false", "feedback.enabled=false")


@pytest.fixture(scope="module")
def codex() -> str:
    done = subprocess.run(
        ["bash", str(REPO / "tests" / "clients" / "setup_codex.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"tests/clients/setup_codex.sh failed:\n{done.stderr}")
    return done.stdout.strip()


def codex_home(demo: Demo, model_line: bool) -> Path:
    """An isolated CODEX_HOME holding the README's config.toml, pointed at this test's port (and
    without its ``model`` line when ``model_line`` is false: Codex then asks for its default)."""
    home = demo.folder / "codex-home"
    home.mkdir(exist_ok=True)
    config = readme_block("toml", "### Codex CLI").replace("http://127.0.0.1:8080", demo.url)
    if not model_line:
        config = config.replace('model = "kimi-k3"\n', "")
    (home / "config.toml").write_text(config)
    return home


def run_codex(
    codex: str, demo: Demo, *args: str, model_line: bool = True
) -> subprocess.CompletedProcess[str]:
    work = demo.folder / "work"
    work.mkdir(exist_ok=True)
    (work / "notes.txt").write_text("a file for Codex to see\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(demo.folder),
        "CODEX_HOME": str(codex_home(demo, model_line)),
        "GATEWAY_API_KEY": "unused-in-the-demo",
        "NO_PROXY": "127.0.0.1",
    }
    overrides = [arg for setting in OFFLINE for arg in ("-c", setting)]
    command = [codex, "exec", *overrides, "--skip-git-repo-check", *args]
    return subprocess.run(
        command, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240
    )


def test_codex_exec_runs_a_tool_and_resumes_with_its_reasoning(codex: str, demo: Demo) -> None:
    first = run_codex(codex, demo, "List the files in this folder.")
    assert first.returncode == 0, first.stderr[-3000:]
    # The emulated model answers a request offering tools with a call to the first one, Codex's shell
    # tool (exec_command): Codex ran it, sent its output back, and printed the final answer.
    assert re.search(r"^exec\n.*word0 word1", first.stderr, re.M), first.stderr[-3000:]
    assert "word0" in first.stdout
    rows = demo.ledger_rows()
    assert len(rows) >= 2  # the call, then the answer after the tool's output
    assert {(r["endpoint"], r["status"], r["route"]) for r in rows} == {("responses", "ok", "kimi-k3")}
    assert all(r["completion_tokens"] > 0 and r["reasoning_tokens"] > 0 for r in rows)

    second = run_codex(codex, demo, "resume", "--last", "Now say goodbye.")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Now say goodbye." in second.stderr and "word0" in second.stdout
    assert len(demo.ledger_rows()) > len(rows)
    assert demo.errors_returned() == []  # every request of both turns was answered 2xx

    # The first turn's reasoning came back sealed in encrypted_content, and the gateway opened it: the
    # resumed turn's upstream request carries it on the assistant turns it led to.
    last = demo.upstream_bodies()[-1]
    earlier = [m for m in last["messages"] if m["role"] == "assistant"]
    assert len(earlier) >= 2 and all(m.get("reasoning_content", "").startswith("think0 ") for m in earlier)


def test_codex_with_its_default_model_runs_its_custom_exec_tool(codex: str, tmp_path: Path) -> None:
    # A route named as Codex's default model (route aliases do this in a real policy).
    route = f"  {CODEX_DEFAULT_MODEL}:\n    backends: [b300-vllm]\n"
    with running_demo(tmp_path, route) as demo:
        done = run_codex(codex, demo, "List the files in this folder.", model_line=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"model: {CODEX_DEFAULT_MODEL}" in done.stderr and "word0" in done.stdout
        assert demo.errors_returned() == []
        rows = demo.ledger_rows()
        assert len(rows) >= 2 and {(r["route"], r["status"]) for r in rows} == {(CODEX_DEFAULT_MODEL, "ok")}
        # Its tools arrived in an additional_tools item; the model called `exec` (custom: free-text
        # JavaScript), Codex ran it and its output came back as the tool's result.
        last = demo.upstream_bodies()[-1]
        assert "exec" in [tool["function"]["name"] for tool in last["tools"]]
        calls = [m["tool_calls"][0]["function"] for m in last["messages"] if m.get("tool_calls")]
        assert calls[0]["name"] == "exec" and json.loads(calls[0]["arguments"]) == {"input": ANSWER}
        results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
        assert results and "Script" in results[0]
