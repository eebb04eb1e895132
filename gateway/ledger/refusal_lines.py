"""How many log lines refused requests get: a flood of refusals (keyless POSTs, say) must not become a
flood of log lines. Per reason and key, the first ``per_minute`` refusals of a minute get their own
line; the rest of that minute are counted, and said in one line when the next one of that reason and
key is logged (the metrics and the ledger count every refusal whatever the log says)."""

from __future__ import annotations

import logging
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
        # (reason, key) -> [minute, lines logged in it, refusals not logged since the last line]
        self._groups: dict[tuple[str, str], list[int]] = {}

    def allow(self, reason: str, key: str, log: logging.Logger) -> bool:
        """True when this refusal gets its own line; first logs how many of its group went unlogged."""
        minute = int(self._clock() // 60)
        group = self._groups.get((reason, key))
        if group is None:
            if len(self._groups) >= MAX_GROUPS:
                self._groups.clear()  # a bound, never reached in practice: forgetting costs a few lines
            group = self._groups[(reason, key)] = [minute, 0, 0]
        if group[0] != minute:
            group[0], group[1] = minute, 0
        if group[1] >= self._per_minute:
            group[2] += 1
            return False
        group[1] += 1
        if group[2]:
            log.info(
                "refused requests for %s (key %s): %d more since the last line, not logged one by one"
                " (at most %d lines a minute)",
                reason,
                key,
                group[2],
                self._per_minute,
            )
            group[2] = 0
        return True
