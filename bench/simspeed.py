"""How fast the simulator replays traffic, and whether its time grows linearly with it: one workload
(kimi-day by default) at 1x, 4x and 16x of a base arrival scale, through the default policy's own
decision; simulated requests per CPU second at each, and each run's CPU time over the 1x run's times
the traffic (1.00 is linear; the issue asks for at most 1.2).

    python -m bench.simspeed                         # kimi-day at 1/16, 1/4 and 1 of its traffic
    python -m bench.simspeed --base-scale 1          # 1x, 4x, 16x of the whole day (1.6M requests)
    GATEWAY_NATIVE=off python -m bench.simspeed      # on the .py files of a compiled build

CPU time (``time.process_time``), so that a machine others load skews it less than wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gateway import native
from gateway.policy.load import load_policy
from gateway.simulate.engine import PolicyRouter, Simulation
from gateway.simulate.report import summarize
from gateway.simulate.workload import read_workload_file, synthesize

REPO = Path(__file__).resolve().parents[1]
FACTORS = (1, 4, 16)


def run(workload_path: Path, policy_path: Path, scale: float) -> tuple[int, float, dict[str, object]]:
    spec = read_workload_file(workload_path)
    assert spec.arrivals is not None
    spec = spec.model_copy(update={"arrivals": spec.arrivals.model_copy(update={"scale": scale})})
    workload = synthesize(spec)
    policy = load_policy(policy_path)
    started = time.process_time()
    result = Simulation(policy, workload, PolicyRouter(policy_path.stem)).run()
    cpu = time.process_time() - started
    return len(workload.requests), cpu, summarize(result)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simspeed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=str(REPO / "bench" / "workloads" / "kimi-day.yaml"))
    parser.add_argument("--policy", default=str(REPO / "policies" / "default.yaml"))
    parser.add_argument("--base-scale", type=float, default=1 / 16, help="the 1x run's arrival scale")
    args = parser.parse_args()
    print(f"{Path(args.workload).name} through {Path(args.policy).name}; 1x = arrivals x {args.base_scale:g}")
    print(f"code: {native.state}")  # GATEWAY_NATIVE=off runs the .py files of a compiled build
    print(f"{'traffic':>8} {'requests':>10} {'CPU s':>8} {'req/CPU s':>10} {'vs linear':>10} {'failed':>7}")
    base_cpu = None
    for factor in FACTORS:
        requests, cpu, summary = run(Path(args.workload), Path(args.policy), args.base_scale * factor)
        base_cpu = cpu if base_cpu is None else base_cpu
        linear = cpu / (base_cpu * factor)
        print(
            f"{factor:>7}x {requests:>10,} {cpu:>8.1f} {requests / cpu:>10,.0f} {linear:>10.2f}"
            f" {summary['failures']:>7}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
