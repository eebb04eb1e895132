"""The ledger's local spool: rows the database cannot take now, kept in a SQLite file until it can.

While the ledger's database is away (a PostgreSQL restart, a SQLite file locked or its disk full) the
writer moves the rows it holds in memory here every flush interval, so a process killed meanwhile
loses only what it had not moved yet; when the database is back the writer writes the spool's rows
to it, oldest first, and removes them. Each row carries the key the writer gave it (``row_key``), and
the database skips a key it already has, so a batch written and then written again (the process died
between the database's commit and the spool's delete) is counted once.

Durability: every move is one transaction with ``synchronous=FULL``, one fsync per move (at most one
per flush interval), so a row in the spool survives a SIGKILL of the process and a crash of the
machine. The file is named after the ledger it is for (a hash of its location): a gateway pointed at
another ledger never replays rows into the wrong one. Several processes may share a spool directory:
SQLite serialises them, and rows are removed by key, so two replaying the same file lose nothing.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.ledger.database import LedgerUnavailable
from gateway.ledger.rows import COLUMNS, LedgerRow
from gateway.ledger.sqlite import connect

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS spooled"
    " (seq INTEGER PRIMARY KEY AUTOINCREMENT, row_key TEXT NOT NULL UNIQUE, row BLOB NOT NULL)"
)
BUSY_TIMEOUT_S = 2.0  # another process moving rows holds the file this long at most, in practice


def spool_file(directory: Path, location: str) -> Path:
    """The spool of the ledger at ``location`` (a file path or a URL without its password)."""
    digest = hashlib.sha256(location.encode()).hexdigest()[:16]
    return directory / f"ledger-spool-{digest}.sqlite3"


class Spool:
    """One spool file, used by the writer thread only. Every method raises ``LedgerUnavailable``
    when the file cannot be read or written (disk full, read-only, locked past the busy timeout)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self.depth = 0  # rows in the file, as this process last counted them

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                # Each move fsynced: a crash keeps the rows.
                conn = connect(self.path, wait_s=BUSY_TIMEOUT_S, synchronous="FULL")
                conn.execute(SCHEMA)
            except (sqlite3.Error, OSError) as exc:
                raise LedgerUnavailable(f"cannot open the ledger spool {self.path}: {exc}") from exc
            self._conn = conn
        return self._conn

    def count(self) -> int:
        """Rows in the file now (other processes sharing it included); no file is made to say 0."""
        if self._conn is None and not self.path.exists():
            self.depth = 0
            return 0
        try:
            self.depth = int(self._connection().execute("SELECT count(*) FROM spooled").fetchone()[0])
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot read the ledger spool {self.path}: {exc}") from exc
        return self.depth

    def add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Keep ``rows`` (each ending with its row key), all or none, durably."""
        conn = self._connection()
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(
                    "INSERT INTO spooled (row_key, row) VALUES (?, ?) ON CONFLICT (row_key) DO NOTHING",
                    [(row[-1], orjson.dumps(row)) for row in rows],
                )
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot write the ledger spool {self.path}: {exc}") from exc
        self.depth += len(rows)

    def oldest(self, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` rows, oldest first, as they were added (row key last)."""
        try:
            found = (
                self._connection()
                .execute("SELECT row FROM spooled ORDER BY seq LIMIT ?", (limit,))
                .fetchall()
            )
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot read the ledger spool {self.path}: {exc}") from exc
        return [tuple(orjson.loads(blob)) for (blob,) in found]

    def remove(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Remove rows the database now holds: by key, so a row another process added meanwhile stays."""
        conn = self._connection()
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("DELETE FROM spooled WHERE row_key = ?", [(row[-1],) for row in rows])
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot update the ledger spool {self.path}: {exc}") from exc
        self.depth = max(0, self.depth - len(rows))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def upgraded(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A spooled row in today's columns: one spooled before a migration added columns gets their
    defaults (added columns always come last, before the key)."""
    missing = len(COLUMNS) - len(row)
    if missing <= 0:
        return row
    defaults = LedgerRow._field_defaults
    added = tuple(defaults.get(name) for name in LedgerRow._fields[len(row) - 1 :])
    return (*row[:-1], *added, row[-1])
