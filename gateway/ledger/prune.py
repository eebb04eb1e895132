"""Retention: delete the request rows that started before an hour, keeping their sums in the hourly
rollup (``spend_rollup``), so every spend report over the ledger says what it said before.

Before deleting, the rollup of the span to prune is checked against a full scan of its rows (counts
and tokens equal, USD within summation rounding): rows that reached the table without the rollup's
trigger (a bulk load with triggers off) would otherwise vanish from the totals. The check, the delete
and the record of what was pruned (``ledger_pruned``, which the reports read) are one transaction.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gateway.ledger.database import LedgerDatabase, LedgerUnavailable
from gateway.ledger.reader import LedgerReader
from gateway.ledger.rollup import DIMENSIONS, HOUR_S, hour_of
from gateway.ledger.rows import SpendTotal

USD_TOLERANCE = 1e-9  # relative: the rollup's USD sums and a scan's differ only in summation order


@dataclass(frozen=True, slots=True)
class Pruned:
    before: float  # rows that started before this (an hour's start) were deleted
    rows: int
    earliest: float | None  # the oldest deleted row's start


class RollupMismatch(LedgerUnavailable):
    """The rollup does not hold the rows about to be pruned: nothing is deleted."""


def prune(database: LedgerDatabase, before: float, *, dry_run: bool = False) -> Pruned:
    """Delete the rows that started before the hour holding ``before``; raise ``RollupMismatch`` (and
    delete nothing) when the rollup does not sum them."""
    cutoff = float(hour_of(before) * HOUR_S)
    with database.maintaining() as ledger:
        if not ledger.rolled_up:
            raise LedgerUnavailable(
                f"the ledger at {ledger.location} has no spend rollup yet: run `gateway ledger migrate` first"
            )
        counted = ledger.query("SELECT count(*), min(time) FROM requests WHERE time < ?", (cutoff,))
        rows, earliest = int(counted[0][0]), counted[0][1]
        if rows == 0 or dry_run:
            return Pruned(cutoff, rows, None if earliest is None else float(earliest))
        check_rollup(ledger, float(hour_of(float(earliest)) * HOUR_S), cutoff)
        ledger.execute("DELETE FROM requests WHERE time < ?", (cutoff,))
        record = "INSERT INTO ledger_pruned (before, earliest, rows, pruned_at) VALUES (?, ?, ?, ?)"
        ledger.execute(record, (cutoff, float(earliest), rows, time.time()))
    return Pruned(cutoff, rows, float(earliest))


def check_rollup(ledger: LedgerReader, since: float, until: float) -> None:
    """Raise ``RollupMismatch`` unless every grouping's rollup over [since, until) equals a scan."""
    for dimension in DIMENSIONS:
        if dimension == "refused":
            rolled_refusals = ledger.refusals(since, until)
            scanned_refusals = ledger.scan_refusals(since, until)
            if sorted(rolled_refusals) != sorted(scanned_refusals):
                raise RollupMismatch(f"refusals: rollup {rolled_refusals} != rows {scanned_refusals}")
            continue
        rolled = {t.key: t for t in ledger.totals(dimension, since, until)}
        scanned = {t.key: t for t in ledger.scan_totals(dimension, since, until)}
        for key in rolled.keys() | scanned.keys():
            if not same_total(rolled.get(key), scanned.get(key)):
                raise RollupMismatch(
                    f"{ledger.location}: the spend rollup by {dimension} does not match the rows for "
                    f"{key!r} ({rolled.get(key)} != {scanned.get(key)}); nothing pruned"
                )


def same_total(a: SpendTotal | None, b: SpendTotal | None) -> bool:
    """Equal counts and tokens, the same cost bases, USD within summation rounding."""
    if a is None or b is None:
        return a is b
    if a[1:7] != b[1:7] or (a.fallbacks, a.refused) != (b.fallbacks, b.refused):
        return False
    if set(filter(None, a.bases.split(","))) != set(filter(None, b.bases.split(","))):
        return False
    return math.isclose(a.cost_usd, b.cost_usd, rel_tol=USD_TOLERANCE, abs_tol=1e-12)
