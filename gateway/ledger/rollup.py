"""Spend totals at volume, read from the hourly rollup (``spend_hourly``, migration 6) and made exact
at the window's edges from the raw rows.

A window [since, until) is the whole hours inside it, read from the rollup, plus the part of the
hour ``since`` falls in, read from ``requests`` (at most an hour of rows), minus the rows of the hour
``until`` falls in that started at or after ``until`` (normally none: ``until`` is now). The trigger
that fills the rollup runs in the same transaction as each insert, so its sums are the rows' sums:
the counts and tokens equal a full scan's exactly, the USD to the last bits of floating-point
summation order (a full scan's ``SUM`` has no fixed order either).

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
# spend_hourly's groupings: the report's ``--by`` names, and refused requests by reason.
DIMENSIONS = ("route", "backend", "key", "replica", "user", "refused")


class Querying(Protocol):
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


def hour_of(time: float) -> int:
    """The largest h with h * 3600 <= time, computed as the migration's SQL computes it."""
    hour = math.floor(time / HOUR_S)
    return hour - 1 if hour * HOUR_S > time else hour


@dataclass(slots=True)
class _Sum:
    """One key's running total, with its requests per cost basis (a basis whose count the until
    edge takes back to zero drops out)."""

    values: list[Any] = field(default_factory=lambda: [0, 0, 0, 0, 0, 0, 0.0, 0, 0])
    bases: dict[str, int] = field(default_factory=dict)

    def add(self, basis: str, values: Sequence[Any], sign: int) -> None:
        for i, value in enumerate(values):
            self.values[i] += sign * (value or 0)
        self.bases[basis] = self.bases.get(basis, 0) + sign * int(values[0])


# The sums a SpendTotal holds, in its order after ``key``, as a rollup and as a raw scan read them.
ROLLUP_SUMS = (
    "sum(requests), sum(errors), sum(prompt_tokens), sum(cached_prompt_tokens), sum(completion_tokens),"
    " sum(reasoning_tokens), sum(cost_usd), sum(fallbacks), sum(refused)"
)
RAW_SUMS = (
    "count(*), sum(CASE WHEN status <> 'ok' THEN 1 ELSE 0 END), sum(prompt_tokens),"
    " sum(cached_prompt_tokens), sum(completion_tokens), sum(reasoning_tokens), sum(cost_usd),"
    " sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END), sum(CASE WHEN status = 'refused' THEN 1 ELSE 0 END)"
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


def rollup_totals(
    reader: Querying, dimension: str, since: float, until: float | None, pruned_before: float | None
) -> list[SpendTotal]:
    """Per key of ``dimension``, the totals of the rows that started in [since, until)."""
    sums: dict[str | None, _Sum] = {}
    first = hour_of(since)
    if pruned_before is not None and since < pruned_before:
        since = first * HOUR_S  # the raw rows of that hour are gone: count it whole
    if since > first * HOUR_S:  # the partial first hour, from the raw rows
        edge_end = (first + 1) * HOUR_S if until is None else min(until, (first + 1) * HOUR_S)
        _merge(sums, _raw(reader, dimension, since, edge_end), 1)
        first += 1
    last = None if until is None else hour_of(until)  # the hour holding until, if it has started
    if until is not None and last is not None and last * HOUR_S == until:
        last -= 1  # until starts an hour: that hour is outside the window
    if last is None or last >= first:
        _merge(sums, _rolled(reader, dimension, first, last), 1)
        if until is not None and last is not None and (last + 1) * HOUR_S > until:
            _merge(sums, _raw(reader, dimension, until, (last + 1) * HOUR_S), -1)
    return _totals(sums)


def _rolled(reader: Querying, dimension: str, first: int, last: int | None) -> list[Any]:
    upper = "" if last is None else " AND hour <= ?"
    params: tuple[Any, ...] = (dimension, first) if last is None else (dimension, first, last)
    query = (
        f"SELECT CASE WHEN name_null THEN NULL ELSE name END, cost_basis, {ROLLUP_SUMS} FROM spend_hourly"
        f" WHERE dimension = ? AND hour >= ?{upper} GROUP BY name, name_null, cost_basis"
    )
    return reader.query(query, params)


def _raw(reader: Querying, dimension: str, since: float, until: float) -> list[Any]:
    column = RAW_KEYS[dimension]
    refused_only = " AND status = 'refused'" if dimension == "refused" else ""
    query = (
        f"SELECT {column}, coalesce(cost_basis, ''), {RAW_SUMS} FROM requests"
        f" WHERE time >= ? AND time < ?{refused_only} GROUP BY 1, 2"
    )
    return reader.query(query, (since, until))


def _merge(sums: dict[str | None, _Sum], rows: Iterable[Sequence[Any]], sign: int) -> None:
    for key, basis, *values in rows:
        total = sums.get(key)
        if total is None:
            total = sums[key] = _Sum()
        total.add(basis, values, sign)


def _totals(sums: dict[str | None, _Sum]) -> list[SpendTotal]:
    totals = []
    for key, total in sums.items():
        requests, errors, prompt, cached, completion, reasoning, usd, fallbacks, refused = total.values
        if requests <= 0:
            continue
        bases = ",".join(sorted(b for b, n in total.bases.items() if b and n > 0))
        ints = (int(requests), int(errors), int(prompt), int(cached), int(completion), int(reasoning))
        totals.append(SpendTotal(key, *ints, float(usd), bases, int(fallbacks), int(refused)))
    # The full scan's order: largest spend first, then by key (no key last).
    totals.sort(key=lambda t: (-t.cost_usd, t.key is None, t.key or ""))
    return totals
