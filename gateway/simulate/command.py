"""``gateway simulate``: load policies and a workload, run each policy and baseline in virtual time,
print the table, write ``report.json`` and the plots.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import PolicyError, load_policy
from gateway.simulate.baselines import baseline_names, make_router
from gateway.simulate.engine import PolicyRouter, Router, RunResult, Simulation
from gateway.simulate.replay import ledger_workload
from gateway.simulate.report import over_time, render_table, summarize
from gateway.simulate.workload import Workload, WorkloadError, read_workload_file, synthesize

LEDGER_PREFIX = "ledger:"


def load_workload(text: str, since: str) -> Workload:
    if text.startswith(LEDGER_PREFIX):
        from gateway.money.spend import parse_since

        try:
            start = parse_since(since, time.time())
        except ValueError as exc:
            raise WorkloadError(str(exc)) from None
        return ledger_workload(Path(text.removeprefix(LEDGER_PREFIX)), start)
    return synthesize(read_workload_file(text))


def routers_for(
    policies: list[tuple[str, CompiledPolicy]], baselines: list[str]
) -> list[tuple[Router, CompiledPolicy]]:
    """Each policy with its own decision, then each baseline on the first policy's backends and routes."""
    runs: list[tuple[Router, CompiledPolicy]] = [(PolicyRouter(name), policy) for name, policy in policies]
    first = policies[0][1]
    names: list[str] = []
    for baseline in baselines:
        for name in baseline_names(first) if baseline == "all" else [baseline]:
            if name not in names:
                names.append(name)
    runs += [(make_router(name, first), first) for name in names]
    return runs


def simulate_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    # Piped into a file or a CI log, rich would wrap at 80 columns: give the table room instead.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    progress_console = Console(stderr=True)
    try:
        policies = [(_policy_name(path, args.policy), load_policy(path)) for path in args.policy]
        workload = load_workload(args.workload, args.since)
        runs = routers_for(policies, args.baseline)
    except (PolicyError, WorkloadError, ValueError) as exc:
        print(f"gateway simulate: {exc}", file=sys.stderr)
        return 2
    print(
        f"simulating {len(workload.requests):,} requests over {workload.duration_s / 3600:.2f} h"
        f" ({workload.name}) with {len(runs)} policies and baselines",
        file=sys.stderr,
    )
    results: list[tuple[RunResult, float, str]] = []
    for router, policy in runs:
        kind = "policy" if isinstance(router, PolicyRouter) else "baseline"
        try:
            result, cpu_s = run_one(
                router, policy, workload, args.seed, show_progress=not args.quiet, console=progress_console
            )
        except (WorkloadError, ValueError) as exc:
            print(f"gateway simulate: {router.name}: {exc}", file=sys.stderr)
            return 2
        results.append((result, cpu_s, kind))
    report = [
        {**summarize(result), "kind": kind, "cpu_s": cpu_s, "over_time": over_time(result)}
        for result, cpu_s, kind in results
    ]
    title = (
        f"{workload.name}: {len(workload.requests):,} requests, {workload.duration_s / 3600:.2f} h simulated"
    )
    console.print(render_table(report, title))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_bytes(
        orjson.dumps(
            {"workload": workload.name, "requests": len(workload.requests), "runs": report},
            option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
        )
    )
    written = [out / "report.json"]
    if not args.no_plots:
        from gateway.simulate.plots import write_plots

        written += write_plots(report, out, title)
    cpu = ", ".join(f"{r['name']} {r['cpu_s']:.1f}s" for r in report)
    print(f"CPU seconds per run: {cpu}", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def run_one(
    router: Router,
    policy: CompiledPolicy,
    workload: Workload,
    seed: int,
    *,
    show_progress: bool,
    console: Any,
) -> tuple[RunResult, float]:
    """One run, its CPU seconds, with a progress bar on stderr when asked."""
    simulation = Simulation(policy, workload, router, seed=seed)
    started = time.process_time()
    if not show_progress:
        result = simulation.run()
        return result, time.process_time() - started
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"))
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task(router.name, total=1.0)
        result = simulation.run(lambda done: progress.update(task, completed=done))
    return result, time.process_time() - started


def _policy_name(path: str, paths: list[str]) -> str:
    stem = Path(path).stem
    return stem if sum(Path(p).stem == stem for p in paths) == 1 else path
