"""Billable rows not yet written, waiting in memory for the ledger's writer thread: at most
``max_rows``, past which the oldest is dropped and counted (``dropped``), so a ledger that can write
nowhere costs memory up to a limit. Refused requests' rows wait apart (``refused.py``).

Rows are appended on the event loop and leave from the front in the writer's thread: in batches for
the database (``take``), or all at once for the spool, where they stay here, counted and bounded, until
the spool has them (``oldest``, then ``moved`` or ``not_moved``). Taken out before, they were in neither
place while the spool was tried, and put back after a failure they pushed out the rows appended
meanwhile. A row evicted while on its way to the spool is counted dropped only if the spool then
fails: ``dropped`` is a counter (a metric), so it never goes back.
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
        self._moving = 0  # rows at the front that ``oldest`` handed to the spool, still here
        self._evicted_moving = 0  # of those, evicted meanwhile: dropped unless the spool took them

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, row: LedgerRow) -> None:
        rows = self._rows
        if len(rows) >= self.max_rows:
            with self._front:
                if len(rows) >= self.max_rows:  # the writer may have taken some meanwhile
                    rows.popleft()
                    if self._moving:
                        self._moving -= 1
                        self._evicted_moving += 1
                    else:
                        self.dropped += 1
        rows.append(row)

    def take(self, count: int) -> list[LedgerRow]:
        """Up to ``count`` of the oldest rows, taken out."""
        rows = self._rows
        with self._front:
            return [rows.popleft() for _ in range(min(count, len(rows)))]

    def oldest(self) -> list[LedgerRow]:
        """Every row, oldest first, for the spool; they stay until ``moved`` or ``not_moved``."""
        with self._front:
            self._moving, self._evicted_moving = len(self._rows), 0
            return list(self._rows)

    def moved(self) -> None:
        """The spool has the rows ``oldest`` gave: out with those still here."""
        rows = self._rows
        with self._front:
            for _ in range(self._moving):
                rows.popleft()
            self._moving = self._evicted_moving = 0

    def not_moved(self) -> None:
        """The spool did not take them: they wait on, and those evicted meanwhile are dropped."""
        with self._front:
            self.dropped += self._evicted_moving
            self._moving = self._evicted_moving = 0
