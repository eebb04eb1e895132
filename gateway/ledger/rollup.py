"""Spend totals at volume, read from the rollup (``spend_rollup``, migration 6: sums per hour and per
day) and made exact at the window's edges from the raw rows.

A window [since, until) is its whole days (day rows), the whole hours of its partial days (hour
rows), and the rows of the partial hours at its ends, read from ``requests`` by the time index (at
most an hour of rows at each end; none at an end where the rest of its hour has no rows, as after
``until`` = now). The trigger that fills the rollup runs in the same transaction as each insert, so
its sums are the rows' sums: counts and tokens equal a full scan's exactly, USD to the last bits of
floating-point summation order (a full scan's ``SUM`` has no fixed order either).

After ``gateway ledger prune`` the raw rows before its hour are gone: a window starting inside the
pruned span counts that hour whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.ledger.rows import SpendTotal

HOUR_S = 3600
# spend_rollup's groupings: the report's ``--by`` names, and refused requests by reason.
DIMENSIONS = ("route", "backend", "key", "replica", "user", "refused")


class Querying(Protocol):
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


def hour_of(time: float) -> int:
    """The largest h with h * 3600 <= time, computed as the migration's SQL computes it."""
    hour = math.floor(time / HOUR_S)
    return hour - 1 if hour * HOUR_S > time else hour


@dataclass(slots=True)
class _Sum:
    """One key's running total and the cost bases its rows had."""

    values: list[Any] = field(default_factory=lambda: [0, 0, 0, 0, 0, 0, 0.0, 0, 0])
    bases: set[str] = field(default_factory=set)

    def add(self, basis: str, values: Sequence[Any]) -> None:
        for i, value in enumerate(values):
            self.values[i] += value or 0
        self.bases.add(basis)


# The sums a SpendTotal holds, in its order after ``key``, as the rollup and the raw rows give them.
ROLLUP_SUMS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "fallbacks",
    "refused",
)
RAW_SUMS = (  # a row counts the requests it stands for (a folded flood of refusals: ledger/refused.py)
    "request_count",
    "CASE WHEN status <> 'ok' THEN request_count ELSE 0 END",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "CASE WHEN attempts > 1 THEN 1 ELSE 0 END",
    "CASE WHEN status = 'refused' THEN request_count ELSE 0 END",
)
# Each dimension's key as a raw row has it (refused: the reason, '' for none, as the rollup keeps it).
RAW_KEYS = {
    "route": "route",
    "backend": "backend",
    "key": "api_key_name",
    "replica": "replica",
    "user": "user_hash",
    "refused": "coalesce(error_type, '')",
}
Part = tuple[str, tuple[Any, ...]]  # a subquery of the one statement, and its parameters


def rollup_totals(
    reader: Querying, dimension: str, since: float, until: float | None, pruned_before: float | None
) -> list[SpendTotal]:
    """Per key of ``dimension``, the totals of the rows that started in [since, until): one statement
    that sums the rollup's buckets and the edges' raw rows (a few indexed probes first say which)."""
    parts: list[Part] = []
    first = hour_of(since)  # the first whole hour, once the partial one is read
    if pruned_before is not None and since < pruned_before:
        since = first * HOUR_S  # the raw rows of that hour are gone: count it whole
    if since > first * HOUR_S and _any_rows(reader, first * HOUR_S, since):
        edge_end = (first + 1) * HOUR_S if until is None else min(until, (first + 1) * HOUR_S)
        parts.append(_raw(dimension, since, edge_end))
        first += 1
    end: int | None = None  # the hour after the last whole one; None: no end
    if until is not None:
        end = hour_of(until)
        if end * HOUR_S < until and end >= first:  # a partial last hour
            if _any_rows(reader, until, (end + 1) * HOUR_S):
                parts.append(_raw(dimension, end * HOUR_S, until))
            else:  # nothing in it after until (until is now): the hour's rollup is the window's
                end += 1
    if end is None or end > first:
        parts += [_rolled(dimension, hours, low, high) for hours, low, high in _spans(first, end)]
    if not parts:
        return []
    sums = ", ".join(f"sum(s{i})" for i in range(len(ROLLUP_SUMS)))
    union = " UNION ALL ".join(sql for sql, _ in parts)
    query = f"SELECT k, b, {sums} FROM ({union}) AS parts GROUP BY k, b"
    return _totals(reader.query(query, tuple(p for _, params in parts for p in params)))


def _spans(first: int, end: int | None) -> list[tuple[int, int, int | None]]:
    """(hours per bucket, first bucket, bucket after the last or None) covering hours [first, end):
    whole days as day buckets, the hours either side as hour buckets."""
    first_day = -(-first // 24)
    end_day = None if end is None else end // 24
    if end_day is not None and end_day <= first_day:
        return [(1, first, end)]
    spans: list[tuple[int, int, int | None]] = [(24, first_day, end_day)]
    if first < first_day * 24:
        spans.append((1, first, first_day * 24))
    if end_day is not None and end is not None and end > end_day * 24:
        spans.append((1, end_day * 24, end))
    return spans


def _any_rows(reader: Querying, since: float, until: float) -> bool:
    return bool(reader.query("SELECT 1 FROM requests WHERE time >= ? AND time < ? LIMIT 1", (since, until)))


def _rolled(dimension: str, hours: int, low: int, high: int | None) -> Part:
    upper = "" if high is None else " AND bucket < ?"
    params: tuple[Any, ...] = (dimension, hours, low) if high is None else (dimension, hours, low, high)
    sums = ", ".join(f"{column} AS s{i}" for i, column in enumerate(ROLLUP_SUMS))
    query = (
        f"SELECT CASE WHEN name_null THEN NULL ELSE name END AS k, cost_basis AS b, {sums} FROM spend_rollup"
        f" WHERE dimension = ? AND hours = ? AND bucket >= ?{upper}"
    )
    return query, params


def _raw(dimension: str, since: float, until: float) -> Part:
    refused_only = " AND status = 'refused'" if dimension == "refused" else ""
    sums = ", ".join(f"{expression} AS s{i}" for i, expression in enumerate(RAW_SUMS))
    query = (
        f"SELECT {RAW_KEYS[dimension]} AS k, coalesce(cost_basis, '') AS b, {sums} FROM requests"
        f" WHERE time >= ? AND time < ?{refused_only}"
    )
    return query, (since, until)


def _totals(rows: Iterable[Sequence[Any]]) -> list[SpendTotal]:
    sums: dict[str | None, _Sum] = {}
    for key, basis, *values in rows:
        total = sums.get(key)
        if total is None:
            total = sums[key] = _Sum()
        total.add(basis, values)
    totals = []
    for key, total in sums.items():
        requests, errors, prompt, cached, completion, reasoning, usd, fallbacks, refused = total.values
        if requests <= 0:
            continue
        bases = ",".join(sorted(b for b in total.bases if b))
        ints = (int(requests), int(errors), int(prompt), int(cached), int(completion), int(reasoning))
        totals.append(SpendTotal(key, *ints, float(usd), bases, int(fallbacks), int(refused)))
    # The full scan's order: largest spend first, then by key (no key last).
    totals.sort(key=lambda t: (-t.cost_usd, t.key is None, t.key or ""))
    return totals
