"""OpenAI's Codex CLI, unmodified, against `gateway demo`: the README's provider block, default
features, `codex exec` with a tool round trip (the emulated model calls Codex's shell tool, Codex runs
it), then `codex exec resume` carrying the first turn's sealed reasoning back. Asserts on what Codex
printed, that no request was refused, and on the ledger rows. Codex talks to 127.0.0.1 only (no login,
update check, analytics or feedback)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.clients.conftest import Demo
from tests.test_demo import readme_block

REPO = Path(__file__).resolve().parents[2]
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


def codex_home(demo: Demo) -> Path:
    """An isolated CODEX_HOME holding the README's config.toml, pointed at this test's port."""
    home = demo.folder / "codex-home"
    home.mkdir(exist_ok=True)
    config = readme_block("toml", "### Codex CLI").replace("http://127.0.0.1:8080", demo.url)
    (home / "config.toml").write_text(config)
    return home


def run_codex(codex: str, demo: Demo, *args: str) -> subprocess.CompletedProcess[str]:
    work = demo.folder / "work"
    work.mkdir(exist_ok=True)
    (work / "notes.txt").write_text("a file for Codex to see\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(demo.folder),
        "CODEX_HOME": str(codex_home(demo)),
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
