"""The README keeps up with the code: its command table lists every command and option the CLI has,
and the test command says what a cold run costs and what is cached where."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gateway.cli import build_parser
from tests.test_cli import subcommands

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def command_rows() -> list[str]:
    return [row.split(" | ")[0] for row in README.splitlines() if row.startswith("| `gateway ")]


def test_the_command_table_lists_every_command_and_option() -> None:
    parser = build_parser()
    rows = command_rows()
    for command in subcommands(parser):
        child = parser
        for name in command:
            child = next(a for a in child._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        if any(isinstance(a, argparse._SubParsersAction) for a in child._actions):
            continue  # `gateway keys` has actions, each with its own row
        row = next((r for r in rows if r.startswith(f"| `gateway {' '.join(command)}")), None)
        assert row is not None, f"no README row for gateway {' '.join(command)}"
        for action in child._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert option in row, f"{option} of gateway {' '.join(command)} missing from the README"
    assert any(r.startswith("| `gateway --version`") for r in rows)


def test_the_test_command_says_what_a_cold_run_costs_and_what_is_cached_where() -> None:
    setup = (REPO / "tests" / "real" / "setup_llamacpp.sh").read_text()
    cache = re.search(r'CACHE="\$\{GATEWAY_CACHE:-\$HOME/(\S+)\}"', setup)
    assert cache is not None
    note = README.split("bash tests/check.sh\n```", 1)[1].split("\n## ", 1)[0]
    assert "minutes" in note and "llama-server" in note
    for folder in ("bin", "models"):
        assert f"~/{cache.group(1)}/{folder}" in note, folder
    assert "$GATEWAY_CACHE" in note
