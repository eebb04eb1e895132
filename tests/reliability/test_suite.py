"""CI's version of ``python -m bench.reliability``: every registered scenario, short, each row passed.
The scenarios start their own processes on free loopback ports and stop them by pid; their waits only
bound hangs, so a slow machine makes them slower, not red."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reliability.__main__ import SCENARIOS, main, table
from bench.reliability.row import Row, Settings


@pytest.fixture(autouse=True)
def no_network_cost_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


# The chaos row alone drives its fleet for 120 s after starting PostgreSQL, Redis and three replicas:
# past the suite's 120 s default. The rows' own waits bound every hang; this bounds the whole row.
@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_passes_short(name: str, tmp_path: Path) -> None:
    lines: list[str] = []
    rows = SCENARIOS[name](Settings(short=True, out_dir=tmp_path, say=lines.append))
    assert rows, f"{name} returned no row"
    for row in rows:
        shown = json.dumps(row.as_dict(), indent=2, default=str)
        assert row.passed, f"{name}: {row.problems} {row.leaks}\n{shown}\nprogress:\n" + "\n".join(lines)
        assert row.requests > 0


def test_the_command_prints_one_table_and_fails_on_a_failed_row(tmp_path: Path) -> None:
    """The table, JSON and markdown come out, and the exit status says whether every row passed."""
    broken = Row("broken", requests=3, problems=["made to fail"])
    SCENARIOS["broken"] = lambda settings: [broken]
    lines: list[str] = []
    try:
        status = main(["--only", "broken", "--out", str(tmp_path)], say=lines.append)
    finally:
        del SCENARIOS["broken"]
    assert status == 1
    assert table([broken]) in "\n".join(lines)
    assert json.loads((tmp_path / "reliability.json").read_text())[0]["passed"] is False
    assert (tmp_path / "reliability.md").read_text().startswith("| scenario | requests |")
