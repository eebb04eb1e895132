"""What a ledger database offers the writer and the reports, whichever it is (SQLite or PostgreSQL),
and the one error both report when they cannot be reached."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gateway.ledger.reader import LedgerReader


class LedgerUnavailable(Exception):
    """The ledger database cannot be opened, read or written now (gone, full, refusing)."""


class LedgerRejected(LedgerUnavailable):
    """The database is there but refuses these rows for what they hold (a value a column cannot take):
    written again as they are, they would fail forever (``ledger/rejection.py``)."""


class LedgerDatabase(Protocol):
    """One ledger: a local SQLite file (the default) or a PostgreSQL database a fleet shares."""

    @property
    def location(self) -> str:
        """What reports name: the file's absolute path, or the URL without its password."""
        ...

    @property
    def shared(self) -> bool:
        """True when other gateway processes write the same ledger (PostgreSQL)."""
        ...

    def open(self) -> list[int]:
        """Connect and bring the schema to the latest version (return the migrations applied);
        raise ``LedgerUnavailable`` if it cannot."""
        ...

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert rows (``COLUMNS`` order) in one transaction; a row whose key is there is skipped."""
        ...

    def reading(self) -> AbstractContextManager[LedgerReader]:
        """A reader on a connection of its own, closed (or given back) on exit."""
        ...

    def maintaining(self) -> AbstractContextManager[LedgerReader]:
        """A reader on a writable connection of its own, in one transaction committed on a clean exit
        (rolled back on an exception): for maintenance such as ``gateway ledger prune``."""
        ...

    def close(self) -> None: ...
