"""How many log lines refused requests get: a flood of refusals (keyless POSTs, say) must not become a
flood of log lines. Per reason and key, the first ``per_minute`` refusals of a minute get their own
line; the rest of that minute are counted and said in one line once the minute is over (or at the
stop). The metrics and the ledger count every refusal whatever the log says."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LINES_PER_MINUTE = 10
MAX_GROUPS = 1_000  # reasons x keys: a bound the gateway's vocabulary and the policy's keys hardly reach


class RefusalLines:
    def __init__(
        self, per_minute: int = LINES_PER_MINUTE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._lock = threading.Lock()  # asked on the event loop, summed up by the ledger's writer
        # (reason, key) -> [minute, lines logged in it, refusals not logged in it]
        self._groups: dict[tuple[str, str], list[int]] = {}

    def allow(self, reason: str, key: str, log: logging.Logger) -> bool:
        """True when this refusal gets its own line (a group's unlogged ones said first, if any)."""
        minute = int(self._clock() // 60)
        with self._lock:
            group = self._groups.get((reason, key))
            if group is None:
                if len(self._groups) >= MAX_GROUPS:
                    self._summarize(log, everything=True)  # a bound never reached in practice
                    self._groups.clear()
                group = self._groups[(reason, key)] = [minute, 0, 0]
            if group[0] != minute:
                self._say(log, reason, key, group)
                group[0], group[1] = minute, 0
            if group[1] >= self._per_minute:
                group[2] += 1
                return False
            group[1] += 1
            return True

    def summarize(self, log: logging.Logger, *, everything: bool = False) -> None:
        """Say how many refusals went unlogged, for each group whose minute is over (all: at a stop)."""
        with self._lock:
            self._summarize(log, everything=everything)

    def _summarize(self, log: logging.Logger, *, everything: bool) -> None:
        minute = int(self._clock() // 60)
        for (reason, key), group in self._groups.items():
            if group[2] and (everything or group[0] != minute):
                self._say(log, reason, key, group)

    def _say(self, log: logging.Logger, reason: str, key: str, group: list[int]) -> None:
        if group[2]:
            log.info(
                "refused requests for %s (key %s): %d more in that minute, not logged one by one"
                " (at most %d lines a minute)",
                reason,
                key,
                group[2],
                self._per_minute,
            )
            group[2] = 0
