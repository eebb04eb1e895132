"""The OpenAI Agents SDK example from the README, run as printed (but for the port) against `gateway
demo`: a Responses model and a chat-completions model, each with `Runner.run` and `Runner.run_streamed`,
each calling its one function tool and answering after the tool's result."""

from __future__ import annotations

import subprocess
import sys

from tests.clients.conftest import Demo
from tests.test_demo import readme_block


def test_the_readme_agents_sdk_example_runs(demo: Demo) -> None:
    snippet = readme_block("python", "### OpenAI Agents SDK").replace("http://127.0.0.1:8080", demo.url)
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=180, cwd=demo.folder
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in printed] == [
        "OpenAIResponsesModel run",
        "OpenAIResponsesModel streamed",
        "OpenAIChatCompletionsModel run",
        "OpenAIChatCompletionsModel streamed",
    ]
    assert all(line.split(": ", 1)[1].startswith("word0 word1") for line in printed)
    assert demo.errors_returned() == []
    rows = demo.ledger_rows()
    # Each of the four runs: the call to the tool, then the answer once the tool's result came back.
    assert [(r["endpoint"], r["status"]) for r in rows] == [("responses", "ok")] * 4 + [("chat", "ok")] * 4
    assert [bool(r["stream"]) for r in rows] == [False, False, True, True] * 2
    results = [
        m["content"] for body in demo.upstream_bodies() for m in body["messages"] if m["role"] == "tool"
    ]
    assert len(results) == 4 and all(r.startswith("sunny in word0") for r in results)
