"""The spend ledger: one row per request in SQLite (embedded default) or PostgreSQL (a fleet's shared
ledger), one writer and one set of report queries over either."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.database import LedgerDatabase, LedgerUnavailable
from gateway.ledger.reader import LedgerReader
from gateway.ledger.rows import COLUMNS, GROUP_COLUMNS, LedgerRow, SpendTotal, row_of
from gateway.ledger.sqlite import SqliteLedger
from gateway.ledger.writer import Ledger

__all__ = [
    "COLUMNS",
    "GROUP_COLUMNS",
    "Ledger",
    "LedgerDatabase",
    "LedgerReader",
    "LedgerRow",
    "LedgerUnavailable",
    "SpendTotal",
    "SqliteLedger",
    "is_url",
    "open_database",
    "row_of",
]

URL_SCHEMES = ("postgresql://", "postgres://")


def is_url(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def open_database(target: str | Path) -> LedgerDatabase:
    """A ``postgresql://`` URL names a PostgreSQL ledger; anything else is a SQLite file's path.
    psycopg is imported only when a URL asks for it."""
    if is_url(target):
        from gateway.ledger.postgres import PostgresLedger

        return PostgresLedger(str(target))
    return SqliteLedger(Path(target))
