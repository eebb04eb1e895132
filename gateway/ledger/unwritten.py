"""Billable rows not yet written, waiting in memory for the ledger's writer thread: at most
``max_rows``, past which the oldest is dropped and counted (``dropped``), so a ledger that can write
nowhere costs memory up to a limit. Refused requests' rows wait apart (``refused.py``).

Rows are appended on the event loop and leave from the front in the writer's thread: in batches for
the database (``take``), or all at once for the spool, where they stay counted here until the spool
has them (``oldest`` then ``forget``). Taken out before, they were in neither place while the spool was
tried, and put back after a failure they pushed out the rows appended meanwhile.
"""

from __future__ import annotations

import threading
from collections import deque

from gateway.ledger.rows import LedgerRow


class UnwrittenRows:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.dropped = 0
        self._rows: deque[LedgerRow] = deque()
        # Held while rows leave the front, by the writer or by an eviction. Appending to the back needs
        # no lock (deque.append is atomic), so the request path takes it only when the bound is reached.
        self._front = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, row: LedgerRow) -> None:
        rows = self._rows
        if len(rows) >= self.max_rows:
            with self._front:
                if len(rows) >= self.max_rows:  # the writer may have taken some meanwhile
                    rows.popleft()
                    self.dropped += 1
        rows.append(row)

    def take(self, count: int) -> list[LedgerRow]:
        """Up to ``count`` of the oldest rows, taken out."""
        rows = self._rows
        with self._front:
            return [rows.popleft() for _ in range(min(count, len(rows)))]

    def oldest(self) -> list[LedgerRow]:
        """Every row, oldest first, left in place."""
        return list(self._rows)

    def forget(self, spooled: list[LedgerRow]) -> None:
        """Take out the rows of ``spooled`` (an ``oldest()`` the spool now has) still at the front. Those
        an eviction took meanwhile were counted dropped, but the spool has them: they are uncounted."""
        ids = {id(row) for row in spooled}  # rows appended since are other objects
        rows = self._rows
        with self._front:
            removed = 0
            while rows and id(rows[0]) in ids:
                rows.popleft()
                removed += 1
            self.dropped -= len(spooled) - removed
