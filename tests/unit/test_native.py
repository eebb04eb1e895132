"""The compiled modules (gateway/native.py) run only when built from the sources beside them: an edit
after the build, or ``GATEWAY_NATIVE=off``, puts every one of them back on its .py file, and the
gateway works either way. Runs on a copy of the package, in a fresh interpreter each time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import native

REPO = Path(__file__).resolve().parents[2]

# In the copy: which code runs, where the simulator's engine came from, and a small simulation's cost
# (the same to the last digit compiled or not).
PROBE = """
import json
from pathlib import Path
from gateway import native
from gateway.policy.load import load_policy
from gateway.simulate.engine import PolicyRouter, Simulation
from gateway.simulate.report import summarize
from gateway.simulate.workload import read_workload_file, synthesize
import gateway.simulate.engine as engine, gateway.measure.stats as stats
spec = read_workload_file(Path(REPO, "bench/workloads/kimi-day.yaml"))
spec = spec.model_copy(update={"arrivals": spec.arrivals.model_copy(update={"scale": 1 / 256})})
policy = load_policy(Path(REPO, "policies/default.yaml"))
result = Simulation(policy, synthesize(spec), PolicyRouter("d")).run()
assert Path(engine.__file__).parent.parent.parent == Path.cwd(), engine.__file__
print(json.dumps([native.state, Path(engine.__file__).name, Path(stats.__file__).name,
                  repr(summarize(result)["total_cost_usd"])]))
"""


def run_in(copy: Path, **env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"REPO = {str(REPO)!r}\n{PROBE}"],
        cwd=copy,  # first on sys.path: the copy's gateway, not the checkout's
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return list(json.loads(out.splitlines()[-1]))


@pytest.mark.skipif(not native.MANIFEST.exists(), reason="nothing built (tests/check.sh builds first)")
def test_a_stale_or_disabled_build_runs_the_sources_and_answers_the_same(tmp_path: Path) -> None:
    shutil.copytree(REPO / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))

    compiled = run_in(tmp_path, GATEWAY_NATIVE="")
    assert compiled[0].startswith("compiled"), compiled
    assert compiled[1].endswith(".so") and compiled[2].endswith(".so"), compiled

    switched_off = run_in(tmp_path, GATEWAY_NATIVE="off")
    assert switched_off[:3] == ["pure Python (GATEWAY_NATIVE=off)", "engine.py", "stats.py"]

    with (tmp_path / "gateway" / "measure" / "decayed.py").open("a") as source:
        source.write("\n# an edit after the build\n")
    stale = run_in(tmp_path, GATEWAY_NATIVE="")
    assert stale[0].startswith("pure Python (sources changed"), stale
    assert stale[1:3] == ["engine.py", "stats.py"]  # all or none: not only the edited module

    assert compiled[3] == switched_off[3] == stale[3]
