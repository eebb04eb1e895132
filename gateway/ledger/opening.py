"""Which ledger a target names: a ``postgresql://`` URL or a SQLite file's path, opened as its database.
Apart from the package so its writer can open a target without importing the package above it."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.database import LedgerDatabase
from gateway.ledger.sqlite import SqliteLedger

URL_SCHEMES = ("postgresql://", "postgres://")


def is_url(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def open_database(target: str | Path, *, answer_timeout_s: float | None = None) -> LedgerDatabase:
    """A ``postgresql://`` URL names a PostgreSQL ledger; anything else is a SQLite file's path.
    psycopg is imported only when a URL asks for it. ``answer_timeout_s``: how long PostgreSQL may leave
    a write unanswered before it is taken as hung (its default when None)."""
    if is_url(target):
        from gateway.ledger.postgres import ANSWER_TIMEOUT_S, PostgresLedger

        return PostgresLedger(str(target), answer_timeout_s=answer_timeout_s or ANSWER_TIMEOUT_S)
    return SqliteLedger(Path(target))
