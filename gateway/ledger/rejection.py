"""Rows a database will not hold as they are, kept from stopping the ledger.

A row can carry what a column refuses: a NUL byte in text (PostgreSQL), an integer past BIGINT, or a
count so large that the spend rollup's sums overflow and every later row of its hour fails with it
(a token count an upstream lied about does that). Retried as a batch, one such row would hold every
row behind it forever. So each row is scrubbed before it is written (``scrubbed``: NUL bytes replaced,
counts clamped, non-finite numbers cleared), and a batch the database still rejects for what it holds
is written in halves until the rows it refuses stand alone (``write_apart``): those are logged whole
and counted, and every other row is written."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gateway.ledger.database import LedgerRejected
from gateway.ledger.rows import COLUMNS

# No request holds 2^31 tokens; clamped there, 4 billion rows still sum within a BIGINT bucket.
INT_LIMIT = 2**31 - 1
# Columns a non-finite number becomes 0.0 in (NOT NULL); in every other float column it becomes None.
NOT_NULL_FLOATS = frozenset(COLUMNS.index(name) for name in ("time", "cost_usd", "queued_s"))

Row = tuple[Any, ...]


def scrubbed(row: Row) -> Row | None:
    """``row`` with what no column takes made safe, or None when it was safe already (the usual case,
    and the cheap one: one pass over the values)."""
    fixed: list[Any] | None = None
    for index, value in enumerate(row):
        kind = type(value)
        if kind is str:
            if "\x00" not in value:
                continue
            safe: Any = value.replace("\x00", "\ufffd")
        elif kind is int:
            if -INT_LIMIT <= value <= INT_LIMIT:
                continue
            safe = INT_LIMIT if value > 0 else -INT_LIMIT
        elif kind is float:
            if math.isfinite(value):
                continue
            safe = 0.0 if index in NOT_NULL_FLOATS else None
        else:
            continue
        if fixed is None:
            fixed = list(row)
        fixed[index] = safe
    return None if fixed is None else tuple(fixed)


def write_apart(write: Callable[[Sequence[Row]], None], rows: Sequence[Row]) -> list[Row]:
    """``write(rows)``; when the database rejects the batch for what it holds, each half on its own,
    down to single rows. Returns the rows rejected alone (written nowhere). ``LedgerUnavailable`` (the
    database away) passes up, the whole batch to be retried: halves already written are skipped then
    by their row keys."""
    try:
        write(rows)
    except LedgerRejected:
        if len(rows) == 1:
            return [rows[0]]
        middle = len(rows) // 2
        return write_apart(write, rows[:middle]) + write_apart(write, rows[middle:])
    return []
