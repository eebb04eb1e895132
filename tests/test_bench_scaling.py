"""``python -m bench.scaling``: the core rule (no throughput ratio from shared cores) and the shared-state
check for real (two workers, a redis-server of its own, the bench upstream), with no throughput load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import scaling
from bench.servers import API_KEY
from bench.suite import Way, wait_ready

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server is not installed (apt-get install redis-server)",
)


@pytest.fixture(autouse=True)
def no_network_cost_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_the_core_rule_wants_a_core_per_worker_plus_the_load_generator_and_the_upstream() -> None:
    assert scaling.refusal(2, [0, 1]) == "not measured: 2 workers need 4 cores, this machine has 2"
    assert scaling.refusal(2, [0, 1, 2]) == "not measured: 2 workers need 4 cores, this machine has 3"
    assert scaling.refusal(2, [0, 1, 2, 3]) is None
    assert scaling.refusal(4, list(range(5))) == "not measured: 4 workers need 6 cores, this machine has 5"
    laid = scaling.Layout.of(2, [4, 5, 6, 7, 8])
    assert (laid.gateway, laid.load, laid.upstream, laid.shared) == ((4, 5), (6,), (7,), False)
    assert laid.gateway_cores(1) == (4,), "one worker gets the first of the workers' cores"
    shared = scaling.Layout.of(2, [0, 1])
    assert shared.shared and shared.gateway == shared.load == shared.upstream == (0, 1)


def test_the_goal_is_judged_only_on_enough_cores() -> None:
    measured = {"measured": True, "layout": {"shared": False}}
    met = scaling.goal({**measured, "ratios": {"nonstream": 1.8, "stream": 1.75}}, 2, 4)
    assert met["status"] == "met" and met["measured"] == "1.80x non-streamed, 1.75x streamed"
    missed = scaling.goal({**measured, "ratios": {"nonstream": 1.8, "stream": 1.6}}, 2, 4)
    assert missed["status"] == "MISSED", "both throughputs must scale"
    refused = scaling.goal({"measured": False, "layout": {"shared": True}}, 2, 2)
    assert refused["status"] == "n/a (2 cores)" and refused["measured"] == "-"
    forced = scaling.goal(
        {"measured": True, "layout": {"shared": True}, "ratios": {"nonstream": 1.9, "stream": 1.9}}, 2, 2
    )
    assert forced["status"] == "n/a (2 cores)", "shared cores never meet (or miss) the goal"
    assert scaling.SHARED_LABEL in forced["measured"]


@needs_redis
def test_too_few_cores_refuse_the_ratio_and_the_shared_state_holds(tmp_path: Path) -> None:
    """The run on two of this machine's cores: no throughput figure, and two workers over one Redis
    admit exactly a key's requests per minute and a route's daily budget, whichever worker answers."""
    cores = scaling.available_cores()[:2]
    lines: list[str] = []
    status = scaling.main(["--workers", "2", "--out", str(tmp_path)], cores=cores, say=lines.append)
    shown = "\n".join(lines)
    assert status == 0, shown
    refusal = f"not measured: 2 workers need 4 cores, this machine has {len(cores)}"
    assert refusal in lines, shown
    assert f"- n/a ({len(cores)} cores): two workers >= 1.7x one worker's throughput (measured -)" in lines
    assert "x non-streamed" not in shown and "req/s" not in shown, "no throughput figure at all"

    results = json.loads((tmp_path / "scaling.json").read_text())
    assert results["throughput"] == {
        "measured": False,
        "refusal": refusal,
        "layout": scaling.Layout.of(2, cores).as_dict(),
    }
    check = results["shared_state"]
    assert check["passed"] and not check["problems"], shown
    assert len(check["workers_on_ready"]) == 2
    rate, budget = check["rate_limit"], check["budget"]
    assert rate["outcomes"] == {"admitted": scaling.RATE_LIMIT, "rate_limit_error": scaling.RATE_EXTRA}
    assert budget["outcomes"] == {
        "admitted": scaling.BUDGET_REQUESTS,
        "budget_exhausted": scaling.BUDGET_EXTRA,
    }
    assert budget["spent_usd"] == pytest.approx(scaling.BUDGET_REQUESTS * scaling.REQUEST_USD)
    for phase in (rate, budget):
        shares = {pid: c["admitted"] + c["refused"] for pid, c in phase["by_worker"].items()}
        assert len(shares) == 2 and sum(shares.values()) == phase["sent"], phase
        assert max(shares.values()) <= phase["allowed"], (
            f"{phase['name']}: a worker's own share exceeds the limit"
        )

    written = (tmp_path / "scaling.md").read_text()
    assert refusal in written and "shared state, 2 workers over one Redis: PASSED" in written


async def test_the_check_fails_when_each_worker_counts_alone(tmp_path: Path) -> None:
    """Its teeth: with the in-memory store each worker keeps its own counts, and the fleet overruns."""
    cores = scaling.available_cores()[:2]
    port = scaling.free_port()
    upstream = scaling.start_upstream(port, cores, tmp_path)
    try:
        assert await wait_ready(Way("direct", port, upstream, "fast", "paced", API_KEY), 20.0) is not None
        lines: list[str] = []
        check = await scaling.check_shared_state(2, cores, port, "memory://", tmp_path, lines.append)
    finally:
        upstream.stop()
    assert not check["passed"] and check["problems"], "\n".join(lines)
    assert scaling.check_lines(check)[0] == "shared state, 2 workers without Redis: FAILED"


def test_without_redis_server_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on this PATH
    assert scaling.main(["--out", str(tmp_path / "out")], cores=[0, 1], say=lambda _: None) == 2
    assert "redis-server is not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
