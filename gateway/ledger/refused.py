"""Refused requests' rows, bounded apart from the billable ones.

A refusal costs nothing and anyone can send a flood of them (a keyless POST is a 401), so their rows
must never push a billable row out of the writer's memory. Per (minute, reason, key, route, door)
the first ``individual_per_minute`` refusals keep a row of their own (its request id, for whoever
asks why their request was refused); the rest of that minute are folded into one row that counts
them (``request_count``), written at the next flush. Rows of their own wait in a queue of their own,
at most ``max_rows``; past it they are folded too. Folded groups are at most ``max_groups`` (a bound
the policy's keys and routes hardly reach); past that a refusal is dropped and counted in
``dropped``, which the metrics and the writer's log report as refused rows.
"""

from __future__ import annotations

import threading
from collections import deque

from gateway.ledger.refusal_lines import RefusalLines
from gateway.ledger.rows import LedgerRow

Group = tuple[int, str | None, str | None, str, str]  # minute, reason, key, route, door


class RefusedRows:
    def __init__(
        self, individual_per_minute: int = 20, max_rows: int = 10_000, max_groups: int = 10_000
    ) -> None:
        self._individual_per_minute = individual_per_minute
        self._max_rows = max_rows
        self._max_groups = max_groups
        self._lock = threading.Lock()  # added on the event loop, taken by the writer thread
        self._rows: deque[LedgerRow] = deque()
        self._seen: dict[Group, int] = {}  # refusals this minute, per group
        self._minute = -1
        self._folded: dict[Group, LedgerRow] = {}  # the first folded row of a group, its count set
        self.folded = 0  # refusals folded into a counting row since start
        self.dropped = 0  # refusals no row counts (every bound full)
        self.lines = RefusalLines()  # and their log lines, bounded alike

    def __len__(self) -> int:
        return len(self._rows) + len(self._folded)

    def add(self, row: LedgerRow) -> None:
        minute = int(row.time // 60)
        group = (minute, row.error_type, row.api_key_name, row.route, row.endpoint)
        with self._lock:
            if minute > self._minute:
                self._seen.clear()  # bounded: only this minute's groups are counted
                self._minute = minute
            seen = self._seen.get(group, 0) + 1
            if len(self._seen) < self._max_groups or group in self._seen:
                self._seen[group] = seen
            if seen <= self._individual_per_minute and len(self._rows) < self._max_rows:
                self._rows.append(row)
                return
            folded = self._folded.get(group)
            if folded is not None:
                self._folded[group] = folded._replace(request_count=folded.request_count + 1)
            elif len(self._folded) < self._max_groups:
                self._folded[group] = row
            else:
                self.dropped += 1
                return
            self.folded += 1

    def take(self) -> list[LedgerRow]:
        """Every row waiting, the folded ones each counting its group's requests; none kept."""
        with self._lock:
            rows = [*self._rows, *self._folded.values()]
            self._rows.clear()
            self._folded.clear()
        return rows
