"""Claude Code (npm @anthropic-ai/claude-code, the pinned version below) run as people run it, `claude -p`,
against `gateway demo` with the environment README's "Claude Code" section gives: no flags, default
tools on, streaming. Each test asserts on what it printed, on every exchange (all 2xx) and on the
ledger. The emulator calls the first tool it is offered, so every turn makes a tool round trip.

Setup: `bash tests/clients/setup_claude_code.sh` (tests/check.sh runs it); until then these skip."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.clients.relayed_demo import REPO, RelayedDemo, cache_dir
from tests.spend.conftest import ledger_rows

CLAUDE_CODE_VERSION = "2.1.332"  # keep in step with setup_claude_code.sh
CLAUDE = cache_dir() / "npm" / f"claude-code-{CLAUDE_CODE_VERSION}" / "node_modules" / ".bin" / "claude"
ANSWER = " ".join(f"word{j}" for j in range(32))  # the emulator's answer (b300-vllm profile)
RUN_TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(
    not CLAUDE.exists(), reason="Claude Code is not installed: run `bash tests/clients/setup_claude_code.sh`"
)


def readme_environment(port_url: str) -> dict[str, str]:
    """The `export NAME=value` lines of README's Claude Code section, on this demo's URL."""
    section = (REPO / "README.md").read_text().split("### Claude Code", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", block, flags=re.M))
    assert "ANTHROPIC_BASE_URL" in exports, block
    exports["ANTHROPIC_BASE_URL"] = exports["ANTHROPIC_BASE_URL"].replace("http://127.0.0.1:8080", port_url)
    return exports


def claude(
    relayed_demo: RelayedDemo, workspace: Path, *args: str, model: bool = True
) -> subprocess.CompletedProcess[str]:
    """One `claude -p` run in ``workspace`` (its own HOME: no settings, no history but its own)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(workspace / "home"), "LANG": "C.UTF-8"}
    env["CLAUDE_CONFIG_DIR"] = str(workspace / "home" / ".claude")
    env.update(readme_environment(relayed_demo.url))
    if not model:
        del env["ANTHROPIC_MODEL"]
    (workspace / "home").mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(CLAUDE), "-p", *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def new_messages(relayed_demo: RelayedDemo, since: int) -> list[Any]:
    return [
        e for e in relayed_demo.relay.exchanges[since:] if e.path == "/v1/messages" and e.method == "POST"
    ]


def rows_for(relayed_demo: RelayedDemo, count: int) -> list[Any]:
    """The last ``count`` ledger rows, once the writer has written them."""
    deadline = time.monotonic() + 30
    while True:
        rows = (
            ledger_rows(relayed_demo.ledger()) if list(relayed_demo.folder.glob("**/ledger.sqlite3")) else []
        )
        if len(rows) >= count or time.monotonic() > deadline:
            return rows[-count:]
        time.sleep(0.2)


def all_answered_2xx(relayed_demo: RelayedDemo, since: int) -> None:
    exchanges = relayed_demo.relay.exchanges[since:]
    assert exchanges, "Claude Code sent nothing"
    failed = [(e.method, e.path, e.status) for e in exchanges if not 200 <= e.status < 300]
    assert failed == []


def tool_names(body: dict[str, Any]) -> list[str]:
    return [str(tool.get("name")) for tool in body.get("tools") or []]


def test_a_turn_with_every_default_tool_and_a_tool_round_trip(
    relayed_demo: RelayedDemo, tmp_path: Path
) -> None:
    since = len(relayed_demo.relay.exchanges)
    run = claude(relayed_demo, tmp_path, "Say hello.")
    assert run.returncode == 0, run.stderr
    assert ANSWER in run.stdout
    all_answered_2xx(relayed_demo, since)
    first, *rest = new_messages(relayed_demo, since)
    assert first.body["model"] == "kimi-k3" and first.body["stream"] is True
    assert {"Bash", "Read", "Edit", "Write"} <= set(tool_names(first.body)), tool_names(first.body)
    assert [m["role"] for m in first.body["messages"]].count("system") >= 1  # what issue 26 met first
    results = [
        block
        for exchange in rest
        for message in exchange.body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert results, "the emulator's tool call came back as a tool result"
    rows = rows_for(relayed_demo, len(rest) + 1)
    assert [(r["route"], r["endpoint"], r["status"]) for r in rows] == [("kimi-k3", "messages", "ok")] * len(
        rows
    )


def test_without_a_model_its_default_id_reaches_the_main_route_by_alias(
    relayed_demo: RelayedDemo, tmp_path: Path
) -> None:
    since = len(relayed_demo.relay.exchanges)
    run = claude(relayed_demo, tmp_path, "Say hello.", model=False)
    assert run.returncode == 0, run.stderr
    assert ANSWER in run.stdout
    all_answered_2xx(relayed_demo, since)
    asked = {exchange.body["model"] for exchange in new_messages(relayed_demo, since)}
    assert asked and all(model.startswith("claude-") for model in asked), asked
    rows = rows_for(relayed_demo, len(new_messages(relayed_demo, since)))
    assert {r["route"] for r in rows} == {"kimi-k3"}


def test_several_turns_of_one_conversation(relayed_demo: RelayedDemo, tmp_path: Path) -> None:
    since = len(relayed_demo.relay.exchanges)
    first = claude(relayed_demo, tmp_path, "Remember the number 7.")
    assert first.returncode == 0, first.stderr
    second_since = len(relayed_demo.relay.exchanges)
    second = claude(relayed_demo, tmp_path, "--continue", "Which number was it?")
    assert second.returncode == 0, second.stderr
    assert ANSWER in second.stdout
    all_answered_2xx(relayed_demo, since)
    carried = new_messages(relayed_demo, second_since)[0].body["messages"]
    said = [
        block.get("text", "") if isinstance(block, dict) else ""
        for message in carried
        for block in (message["content"] if isinstance(message["content"], list) else [message])
    ]
    assert any("Remember the number 7." in text for text in said)  # the first turn came along
    assert sum(1 for message in carried if message["role"] == "assistant") >= 2


def test_its_web_search_is_told_no_backend_searches_instead_of_getting_the_models_words(
    relayed_demo: RelayedDemo, tmp_path: Path
) -> None:
    """WebSearch asks for Anthropic's hosted web_search tool alone: refused in Anthropic's shape,
    Claude Code hands its model that error as the tool's result, and the session still ends well."""
    since = len(relayed_demo.relay.exchanges)
    run = claude(
        relayed_demo,
        tmp_path,
        "Search the web for Kimi.",
        "--tools",
        "WebSearch",
        "--allowedTools",
        "WebSearch",
    )
    assert run.returncode == 0, run.stderr
    hosted = [e for e in new_messages(relayed_demo, since) if "web_search" in tool_names(e.body)]
    assert hosted and all(e.status == 400 for e in hosted)
    last = new_messages(relayed_demo, since)[-1]
    assert last.status == 200
    result = last.body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert "server tool" in str(result["content"])
