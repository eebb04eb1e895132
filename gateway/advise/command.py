"""``gateway advise``: load the policy and the traffic (a ledger window or a synthetic workload), run
the plan search, print the table, the schedule and the limits; write ``advice.json`` and the plots."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from gateway.advise.judging import cores
from gateway.advise.ledger_run import LedgerRun
from gateway.advise.plans import PlanResult
from gateway.advise.runs import Run, WorkloadRun
from gateway.advise.search import advise
from gateway.policy.load import PolicyError, load_policy
from gateway.simulate.workload import WorkloadError, read_workload_file, synthesize


def load_traffic(args: argparse.Namespace) -> Run:
    """A workload file synthesized in memory, or a ledger window read a day at a time."""
    if args.workload:
        return WorkloadRun(synthesize(read_workload_file(args.workload)))
    from gateway.money.spend import parse_since

    try:
        start = parse_since(args.since, time.time())
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    return LedgerRun(args.ledger, start)


def advise_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=200)
    started = cpu_seconds()
    try:
        policy = load_policy(args.policy)
        run = load_traffic(args)
        if isinstance(run, LedgerRun):  # summed day by day, no request held: seconds for a month
            with days_progress(args.quiet) as progress:
                run.sum_days(progress)
        requests = run.summary().requests
        if not 0 < args.slo <= 1:
            raise ValueError(f"--slo {args.slo}: give the share of requests within the SLO, e.g. 0.99")
    except (PolicyError, WorkloadError, ValueError) as exc:
        print(f"gateway advise: {exc}", file=sys.stderr)
        return 2
    print(
        f"advising on {requests:,} requests over {run.duration_s / 3600:.2f} h ({run.name})", file=sys.stderr
    )
    try:
        with plans_progress(args.quiet) as progress:
            advice = advise(
                policy,
                run,
                args.slo,
                seed=args.seed,
                max_replicas=args.max_replicas,
                progress=progress,
                workers=cores(),
                sample=False if args.full_replay else None,
            )
    except (WorkloadError, ValueError) as exc:
        print(f"gateway advise: {exc}", file=sys.stderr)
        return 2
    from gateway.advise.report import render_table, summary_lines, to_json

    console.print(render_table(advice))
    for line in summary_lines(advice):
        console.print(line, highlight=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {**to_json(advice), "cpu_s": cpu_seconds() - started}
    (out / "advice.json").write_bytes(
        orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    written = [out / "advice.json"]
    if not args.no_plots:
        from gateway.advise.report import write_plots

        written += write_plots(advice, advice.busiest_day, out)
    print(f"CPU seconds: {cpu_seconds() - started:.1f} (the plans' workers included)", file=sys.stderr)
    print(peak_memory(), file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def peak_memory() -> str:
    """The parent's peak resident memory and the largest finished worker's (Linux counts KiB)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return f"peak RSS: {own / 1024:,.0f} MiB (this process), {workers / 1024:,.0f} MiB (its largest worker)"


def cpu_seconds() -> float:
    """This process's CPU and its finished workers' (the plans judged in forked processes)."""
    import resource

    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


@contextlib.contextmanager
def days_progress(quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A bar on stderr over the ledger's days as they are summed."""
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("ledger days summed"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=None)
        yield lambda done, days: bar.update(task, completed=done, total=days)


@contextlib.contextmanager
def plans_progress(quiet: bool) -> Iterator[Callable[[PlanResult, int], None] | None]:
    """A bar on stderr over the replays (a plan each, or a plan's sampled day), each named as its
    result comes in."""
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("replays"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TextColumn("{task.description}"), console=Console(stderr=True)) as bar:
        task = bar.add_task("", total=None)

        def judged(result: PlanResult, plans: int) -> None:
            bar.update(task, total=plans, advance=1, description=f"{result.plan.name}: {result.plan.label}")

        yield judged
