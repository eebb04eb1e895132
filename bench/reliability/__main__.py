"""``python -m bench.reliability [--short] [--only NAME ...] [--json PATH] [--out DIR] [--requests N]
[--duration-s S]``:
runs the registered scenarios with progress lines, prints one table, writes it as JSON and markdown to
the out dir, and exits 1 when a row failed (2 when a scenario crashed)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.reliability import chaos, fuzz, matrix, overload, restart, soak
from bench.reliability.row import Row, Scenario, Settings

# name -> scenario; the order is the table's.
SCENARIOS: dict[str, Scenario] = {
    "faults": matrix.run,
    "soak": soak.run,
    "restart": restart.run,
    "overload": overload.run,
    "fuzz": fuzz.run,
    "chaos": chaos.run,
}
COLUMNS = (
    "scenario", "requests", "client-visible failures", "expected failures", "leaks",
    "memory before/after (MB)", "passed",
)  # fmt: skip


def run_all(names: list[str], settings: Settings) -> tuple[list[Row], list[str]]:
    """Every named scenario's rows; a scenario that raised becomes a failed row saying so."""
    rows: list[Row] = []
    crashed: list[str] = []
    for name in names:
        settings.say(f"== {name}{' (short)' if settings.short else ''}")
        started = time.monotonic()
        try:
            found = SCENARIOS[name](settings)
        except Exception as exc:  # one broken scenario must not hide the others' rows
            crashed.append(name)
            settings.say(traceback.format_exc())
            found = [Row(name, problems=[f"the scenario raised {type(exc).__name__}: {exc}"])]
        for row in found:
            row.details.setdefault("wall_s", round(time.monotonic() - started, 1))
            settings.say(f"   {row.scenario}: {'passed' if row.passed else 'FAILED'}")
        rows.extend(found)
    return rows, crashed


def megabytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.0f}"


def cells(row: Row) -> list[str]:
    return [
        row.scenario,
        str(row.requests),
        str(row.client_visible_failures),
        str(row.expected_failures),
        ", ".join(row.leaks) or "none",
        f"{megabytes(row.memory_before_bytes)} / {megabytes(row.memory_after_bytes)}",
        "yes" if row.passed else "NO",
    ]


def table(rows: list[Row], *, markdown: bool = False) -> str:
    body = [list(COLUMNS), *(cells(row) for row in rows)]
    if markdown:
        lines = ["| " + " | ".join(line) + " |" for line in body]
        return "\n".join([lines[0], "|" + "---|" * len(COLUMNS), *lines[1:]])
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in body]
    return "\n".join([text[0], "  ".join("-" * w for w in widths), *text[1:]])


def problems(rows: list[Row]) -> str:
    return "\n".join(f"{row.scenario}: {p}" for row in rows for p in row.problems)


def main(argv: list[str] | None = None, say: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__)
    parser.add_argument("--short", action="store_true", help="CI's version: the same checks, fewer requests")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"run only these ({', '.join(SCENARIOS)})",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/reliability"),
        help="logs, ledgers, policies, and reliability.json / reliability.md",
    )
    parser.add_argument(
        "--requests", type=int, help="the soak's request count (3,000 short, 30,000 long; documented: 100000)"
    )
    parser.add_argument("--duration-s", type=float, help="the chaos row's length (120 s short, 1800 s long)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # the gateway processes read no network
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        short=args.short,
        out_dir=args.out.resolve(),
        say=say,
        seed=args.seed,
        requests=args.requests,
        duration_s=args.duration_s,
    )
    rows, crashed = run_all(args.only or list(SCENARIOS), settings)
    say("")
    say(table(rows))
    if problems(rows):
        say("\n" + problems(rows))
    payload = [row.as_dict() for row in rows]
    for path in [args.out / "reliability.json", *([args.json] if args.json else [])]:
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (args.out / "reliability.md").write_text(table(rows, markdown=True) + "\n")
    if crashed:
        return 2
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
