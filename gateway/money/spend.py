"""Spend, live and past: the running totals the dashboard shows, and the `gateway spend` report over
the ledger (amortized cost and tokens per route, backend or key, plus GPU-hour pools' idle remainder).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from gateway.ledger import LedgerDatabase, LedgerReader, LedgerUnavailable, SpendTotal, open_database
from gateway.ledger.settings import resolve_ledger
from gateway.money.budgets import period_bounds, period_id
from gateway.money.costs import SECONDS_PER_HOUR, usd_per_mtok_of
from gateway.policy.load import PolicyError, load_policy

UNITS_S = MappingProxyType({"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800})
REPORT_FIELDS = (
    "requests",
    "errors",
    "refused",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "usd_per_mtok_out",
    "cost_basis",
    "fallbacks",
)


class SpendTally:
    """Spend per route for today (UTC) and in ``bucket_s`` slices of the last ``window_s``.

    Fed at the end of every request with the same cost the ledger row gets, and seeded from the
    ledger at start, so what the dashboard shows matches the ledger.
    """

    def __init__(self, bucket_s: float = 10.0, window_s: float = 3600.0) -> None:
        self.bucket_s = bucket_s
        self.window_s = window_s
        self._days: dict[tuple[str, str], list[float]] = {}  # (day, route) -> [usd, requests]
        self._buckets: dict[int, dict[str, float]] = {}  # bucket number -> route -> usd

    def add(self, started_wall: float, route: str, usd: float, requests: int = 1) -> None:
        day = self._days.get((period_id("day", started_wall), route))
        if day is None:
            self._prune_days(started_wall)
            day = self._days[(period_id("day", started_wall), route)] = [0.0, 0]
        day[0] += usd
        day[1] += requests
        number = int(started_wall // self.bucket_s)
        bucket = self._buckets.get(number)
        if bucket is None:
            self._prune_buckets(number)
            bucket = self._buckets[number] = {}
        bucket[route] = bucket.get(route, 0.0) + usd

    def seed(
        self, wall: float, day_totals: Iterable[SpendTotal], buckets: Iterable[tuple[float, str, float, int]]
    ) -> None:
        # A route of "" holds the requests refused before they named one: no spend to show.
        for total in day_totals:
            if total.key:
                self._days[(period_id("day", wall), total.key)] = [total.cost_usd, total.requests]
        for start, route, usd, _ in buckets:
            if not route:
                continue
            bucket = self._buckets.setdefault(int(start // self.bucket_s), {})
            bucket[route] = bucket.get(route, 0.0) + usd

    def today(self, wall: float) -> dict[str, tuple[float, int]]:
        """Route -> (USD, requests) since UTC midnight."""
        day = period_id("day", wall)
        return {route: (v[0], int(v[1])) for (d, route), v in self._days.items() if d == day}

    def series(self, wall: float) -> tuple[list[float], dict[str, list[float]]]:
        """Bucket start times over the window, and each route's USD per bucket."""
        last = int(wall // self.bucket_s)
        numbers = list(range(last - int(self.window_s // self.bucket_s) + 1, last + 1))
        routes = sorted({route for bucket in self._buckets.values() for route in bucket})
        empty: dict[str, float] = {}
        values = {r: [self._buckets.get(n, empty).get(r, 0.0) for n in numbers] for r in routes}
        return [n * self.bucket_s for n in numbers], values

    def _prune_days(self, wall: float) -> None:
        keep = {period_id("day", wall), period_id("day", wall - 86_400)}
        for key in [k for k in self._days if k[0] not in keep]:
            del self._days[key]

    def _prune_buckets(self, newest: int) -> None:
        oldest = newest - int(self.window_s // self.bucket_s)
        for number in [n for n in self._buckets if n < oldest]:
            del self._buckets[number]


def seed_tally(tally: SpendTally, ledger: LedgerDatabase, wall: float) -> None:
    """Load today's totals and the window's buckets from the ledger (runs in a worker thread)."""
    try:
        with ledger.reading() as reader:
            day_start, _ = period_bounds("day", wall)
            day_totals = reader.totals("route", day_start)
            tally.seed(wall, day_totals, reader.buckets(wall - tally.window_s, tally.bucket_s))
    except LedgerUnavailable:
        return


# --- gateway spend ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    by: str
    since: float
    until: float
    rows: list[SpendTotal]
    ledger: str  # the ledger read: a file's absolute path or a URL without its password
    note: str | None = None  # e.g. why idle rows are missing
    refusals: tuple[tuple[str, int], ...] = ()  # (reason, requests) the gateway refused, most first


def parse_since(text: str, now: float) -> float:
    """``24h``, ``30m``, ``7d``, ``2w``, ``90s`` before now, or an ISO date/time (UTC unless it says)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        return now - float(match.group(1)) * UNITS_S[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give a span like 24h, 30m, 7d or a date like 2025-06-01"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def build_report(
    ledger: LedgerDatabase, by: str, since: float, now: float, policy_path: str | None
) -> Report:
    with ledger.reading() as reader:
        rows = reader.totals(by, since, now)
        refusals = tuple(reader.refusals(since, now))
        note = None
        if policy_path is None:
            note = "GPU-hour pools' idle (unattributed) cost not shown: pass --policy to include it"
        else:
            rows += idle_rows(reader, policy_path, since, now)
    return Report(by, since, now, rows, ledger.location, note, refusals)


def idle_rows(reader: LedgerReader, policy_path: str, since: float, now: float) -> list[SpendTotal]:
    """What each GPU-hour pool cost over the window that no request was charged.

    The window starts at ``since`` or at the ledger's first row, whichever is later, assuming the
    pool was up and paid for the whole of it; prices are the policy's current ones.
    """
    policy = load_policy(policy_path)
    start = max(since, reader.earliest() or now)
    hours = max(0.0, now - start) / SECONDS_PER_HOUR
    attributed = {t.key: t.cost_usd for t in reader.totals("backend", since, now)}
    rows = []
    for name, backend in policy.backends.items():
        if backend.pool_price is None:
            continue
        idle = max(0.0, backend.pool_price.usd_per_hour * hours - attributed.get(name, 0.0))
        rows.append(SpendTotal(f"(idle) {name}", 0, 0, 0, 0, 0, 0, idle, "gpu_hours_idle"))
    return rows


def report_dicts(report: Report) -> list[dict[str, Any]]:
    out = []
    for row in report.rows:
        per_mtok = usd_per_mtok_of(row.cost_usd, row.completion_tokens)
        out.append(
            {
                report.by: row.key or "(none)",  # a request refused before naming a route has none
                "requests": row.requests,
                "errors": row.errors,
                "refused": row.refused,
                "prompt_tokens": row.prompt_tokens,
                "cached_prompt_tokens": row.cached_prompt_tokens,
                "completion_tokens": row.completion_tokens,
                "reasoning_tokens": row.reasoning_tokens,
                "cost_usd": row.cost_usd,
                "usd_per_mtok_out": per_mtok,
                "cost_basis": row.bases,
                "fallbacks": row.fallbacks,
            }
        )
    return out


def render(report: Report, fmt: str) -> str:
    records = report_dicts(report)
    total = sum(r["cost_usd"] for r in records)
    if fmt == "json":
        window = {"since": _iso(report.since), "until": _iso(report.until)}
        document = {
            "by": report.by,
            "ledger": report.ledger,
            "window": window,
            "rows": records,
            "total_usd": total,
            "refused": [{"reason": reason, "requests": count} for reason, count in report.refusals],
            "note": report.note,
        }
        return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=_fields(report.by), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return out.getvalue()
    return _table(report, records, total)


def _fields(by: str) -> list[str]:
    return [by, *REPORT_FIELDS]


def _table(report: Report, records: Sequence[dict[str, Any]], total: float) -> str:
    headers = [report.by, "requests", "errors", "refused", "prompt", "cached", "completion", "reasoning"]
    headers += ["cost_usd", "usd/1M out", "basis"]
    lines = [
        [
            str(r[report.by]),
            *(f"{r[f]:,}" for f in _fields(report.by)[1:8]),
            f"{r['cost_usd']:.6f}",
            "" if r["usd_per_mtok_out"] is None else f"{r['usd_per_mtok_out']:.2f}",
            r["cost_basis"],
        ]
        for r in records
    ]
    lines.append(["total", *[""] * 7, f"{total:.6f}", "", ""])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i in (0, 10) else c.rjust(w) for i, (c, w) in pairs)

    title = f"spend by {report.by}, {_iso(report.since)} to {_iso(report.until)} (UTC)"
    body = [
        title,
        f"ledger: {report.ledger}",
        fmt(headers),
        fmt(["-" * w for w in widths]),
        *(fmt(line) for line in lines),
    ]
    if report.refusals:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in report.refusals)
        body.append(f"refused, by reason: {reasons}")
    if report.note:
        body.append(f"note: {report.note}")
    return "\n".join(line.rstrip() for line in body) + "\n"


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def spend_main(args: argparse.Namespace, default_policy: str) -> int:
    """`gateway spend`: ``args`` has by, since, format, ledger and policy. The ledger is found the way
    ``serve`` finds it (``--ledger``, ``$GATEWAY_LEDGER``, the policy's ``ledger.url`` or ``ledger.path``),
    and every report says which ledger it read: on stderr, and in the table and the JSON document."""
    try:
        location = resolve_ledger(args.ledger, lambda: load_policy(args.policy or default_policy))
    except PolicyError as exc:
        print(
            f"gateway spend: the policy does not load (give --ledger PATH instead):\n{exc}", file=sys.stderr
        )
        return 2
    if isinstance(location.target, Path) and not location.target.is_file():
        print(
            f"gateway spend: no ledger at {location}; a gateway writes it on its first request "
            "(pass --ledger PATH or URL, set $GATEWAY_LEDGER, or run from the folder `gateway serve` ran in)",
            file=sys.stderr,
        )
        return 2
    now = time.time()
    try:
        since = parse_since(args.since, now)
        report = build_report(open_database(location.target), args.by, since, now, args.policy)
    except (ValueError, LedgerUnavailable, PolicyError) as exc:
        print(f"gateway spend: {exc}", file=sys.stderr)
        return 2
    print(f"ledger: {location}", file=sys.stderr)
    sys.stdout.write(render(report, args.format))
    return 0
