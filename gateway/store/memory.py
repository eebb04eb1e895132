"""The embedded store: one process's counters and rate windows in dictionaries, atomic because nothing
awaits between check and update. The default without Redis, and the Redis store's fallback while away.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.store.interface import BUCKET_S, WINDOW_S, Ask, Message, StoreHealth, Verdict, judge


class MemoryStore:
    shared = False

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self._counters: dict[str, list[float]] = {}  # key -> [spent, reserved]
        self._windows: dict[str, dict[int, float]] = {}  # key -> second -> count
        self.health = StoreHealth(kind="memory")

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def admit(self, ask: Ask) -> Verdict:
        return self.admit_now(ask)

    def admit_now(
        self, ask: Ask, held_in: int = 0, counters_of: Callable[[str], tuple[float, float]] | None = None
    ) -> Verdict:
        """Admit now; ``counters_of`` stands in for this store's own counters (the Redis store's local
        fallback judges against the fleet's last known counts plus its own reservations)."""
        now = self._wall_clock()
        windows = [self._window(charge.key, now) for charge in ask.windows]
        read = counters_of or self.read
        verdict = judge(ask, windows, [read(key) for key in ask.keys], now)
        if verdict.status != "ok":
            return verdict
        for charge, window in zip(ask.windows, windows, strict=True):
            window[verdict.bucket] = window.get(verdict.bucket, 0.0) + charge.amount
        if ask.keys:
            amount = ask.levels[verdict.level]
            for key in ask.keys:
                self._counter(key)[1] += amount
        return Verdict("ok", level=verdict.level, bucket=verdict.bucket, held_in=held_in)

    async def reserve(self, keys: Sequence[str], limits: Sequence[float], amount: float) -> bool:
        """Reserve ``amount`` on every key, or on none: a budget-only admission."""
        verdict = await self.admit(Ask(keys=tuple(keys), limits=tuple(limits), levels=(amount,)))
        return verdict.status == "ok"

    def settle(self, keys: Sequence[str], reserved: float, actual: float, held_in: int = 0) -> None:
        for key in keys:
            counter = self._counter(key)
            counter[0] += actual
            counter[1] = max(0.0, counter[1] - reserved)

    def settle_window(self, key: str, bucket: int, delta: float, held_in: int = 0) -> None:
        window = self._windows.get(key)
        if window is not None and bucket in window:
            window[bucket] = max(0.0, window[bucket] + delta)

    def seed(self, key: str, spent: float) -> None:
        self._counters.setdefault(key, [spent, 0.0])

    def reseed_from(self, totals: Callable[[float], Mapping[str, float]], shared: bool) -> None:
        """Nothing to do: this store lives and dies with the process, which seeds it at start."""

    def read(self, key: str) -> tuple[float, float]:
        counter = self._counters.get(key)
        return (0.0, 0.0) if counter is None else (counter[0], counter[1])

    def release(self, key: str, reserved: float) -> None:
        """Give back a reservation without counting any spend."""
        counter = self._counters.get(key)
        if counter is not None:
            counter[1] = max(0.0, counter[1] - reserved)

    async def exchange(self, outgoing: bytes | None) -> list[Message]:
        return []  # no other replicas to hear from

    def report(self) -> dict[str, Any]:
        return {"kind": "memory", "up": True, "shared": False}

    def _counter(self, key: str) -> list[float]:
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = [0.0, 0.0]
        return counter

    def _window(self, key: str, now: float) -> dict[int, float]:
        """The key's buckets, with those that left the window dropped."""
        window = self._windows.setdefault(key, {})
        oldest = int(now // BUCKET_S) - WINDOW_S // BUCKET_S + 1
        for bucket in [b for b in window if b < oldest]:
            del window[bucket]
        return window
