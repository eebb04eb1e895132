"""The spend ledger: one row per request in SQLite (embedded default) or PostgreSQL (a fleet's shared
ledger), one writer and one set of report queries over either."""

from __future__ import annotations

from gateway.ledger.database import LedgerDatabase, LedgerUnavailable
from gateway.ledger.opening import is_url, open_database
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
