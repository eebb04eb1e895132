"""What the dashboard reads from the ledger, refreshed in the background every few seconds while
someone watches the dashboard: today's totals per route (errors and fallbacks too), backend and
replica, the requests refused today by reason, the last hour in buckets, and (for a shared ledger)
the fleet's newest rows. Never read on a completion request, and not at all while nobody looks: those
queries scan the day's rows, CPU the proxy's core needs for tokens."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.ledger.database import LedgerDatabase, LedgerUnavailable
from gateway.ledger.rows import SpendTotal
from gateway.money.budgets import period_bounds
from gateway.money.spend import SpendTally

log = logging.getLogger("gateway.ledger")
RECENT_ROWS = 50
WATCHED_S = 60.0  # the background refresh runs until this long after the dashboard was last read


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    read_at: float | None = None  # wall time of the read; None: never read
    day_start: float = 0.0
    earliest: float | None = None
    routes: dict[str, SpendTotal] = field(default_factory=dict)
    backends: dict[str, SpendTotal] = field(default_factory=dict)
    replicas: list[SpendTotal] = field(default_factory=list)
    recent: list[dict[str, Any]] = field(default_factory=list)
    tally: SpendTally | None = None  # today's and the last hour's spend, as the ledger has them
    refusals: list[tuple[str, int]] = field(default_factory=list)  # today's refused requests by reason
    error: str | None = None


class LedgerView:
    def __init__(
        self, database: LedgerDatabase, wall_clock: Callable[[], float], refresh_s: float = 2.0
    ) -> None:
        self.database = database
        self._wall_clock = wall_clock
        self.refresh_s = refresh_s
        self.snapshot = LedgerSnapshot()
        self._watched_at: float | None = None

    async def current(self) -> LedgerSnapshot:
        """The snapshot for a dashboard read: it also keeps the background refresh going a while,
        and the first read after a quiet spell waits for a fresh one."""
        wall = self._wall_clock()
        self._watched_at = wall
        read_at = self.snapshot.read_at
        if read_at is None or wall - read_at > 2 * self.refresh_s:
            self.snapshot = await asyncio.to_thread(self.read, wall)
        return self.snapshot

    async def run(self) -> None:
        while True:
            watched = self._watched_at
            if watched is not None and self._wall_clock() - watched <= WATCHED_S:
                self.snapshot = await asyncio.to_thread(self.read, self._wall_clock())
            await asyncio.sleep(self.refresh_s)

    def read(self, wall: float) -> LedgerSnapshot:
        day_start, _ = period_bounds("day", wall)
        try:
            with self.database.reading() as reader:
                routes = reader.totals("route", day_start)
                tally = SpendTally()
                tally.seed(wall, routes, reader.buckets(wall - tally.window_s, tally.bucket_s))
                return LedgerSnapshot(
                    read_at=wall,
                    day_start=day_start,
                    earliest=reader.earliest(),
                    routes={t.key: t for t in routes if t.key is not None},
                    backends={t.key: t for t in reader.totals("backend", day_start) if t.key is not None},
                    replicas=reader.totals("replica", day_start),
                    recent=reader.recent(RECENT_ROWS) if self.database.shared else [],
                    refusals=reader.refusals(day_start),
                    tally=tally,
                )
        except LedgerUnavailable as exc:
            # Keep showing the last good read, saying why it is not newer.
            return LedgerSnapshot(**{**_fields(self.snapshot), "error": str(exc)})


def _fields(snapshot: LedgerSnapshot) -> dict[str, Any]:
    return {name: getattr(snapshot, name) for name in LedgerSnapshot.__dataclass_fields__}
