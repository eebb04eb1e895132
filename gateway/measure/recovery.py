"""When a backend that routes avoid for a slow spell is back: judged against what those routes need
(their SLOs), not against the backend's own history, so the verdict does not depend on how much traffic
it happened to carry before the spell.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.policy.compiled import CompiledRoute
from gateway.values.observation import Attempt


@dataclass(frozen=True, slots=True)
class RecoveryBar:
    """What a probe must show for the routes that exclude a backend now to count it back.

    ``ttft_s``: the loosest TTFT SLO among the routes its measured p95 misses; ``decode_tokens_per_s``:
    the lowest decode floor among those its measured speed misses. The loosest, because forgetting the
    spell only replaces old samples with the probes' own: a route with a tighter SLO then judges the
    backend on those and may keep excluding it, rightly.
    """

    ttft_s: float | None = None
    decode_tokens_per_s: float | None = None

    @property
    def excluded(self) -> bool:
        return self.ttft_s is not None or self.decode_tokens_per_s is not None


NOT_EXCLUDED = RecoveryBar()


def recovery_bar(
    backend: str,
    routes: Iterable[CompiledRoute],
    ttft_p95_s: float | None,
    decode_tokens_per_s: float | None,
) -> RecoveryBar:
    """The bar for ``backend`` given its measured TTFT p95 and decode speed (None: unmeasured)."""
    ttft_bar: float | None = None
    decode_bar: float | None = None
    for route in routes:
        if backend not in route.backends:
            continue
        slo = route.slo
        if slo.ttft_p95_ms is not None and ttft_p95_s is not None:
            limit = slo.ttft_p95_ms / 1000.0
            if ttft_p95_s > limit:
                ttft_bar = limit if ttft_bar is None else max(ttft_bar, limit)
        floor = slo.min_decode_tokens_per_s
        if floor is not None and decode_tokens_per_s is not None and decode_tokens_per_s < floor:
            decode_bar = floor if decode_bar is None else min(decode_bar, floor)
    return RecoveryBar(ttft_bar, decode_bar)


def answered_within(attempt: Attempt, bar: RecoveryBar, median_ttft_s: float | None, ratio: float) -> bool:
    """Whether a probe's answer counts toward a recovery. A backend no route excludes has no SLO to
    meet: there a probe counts when it is ``ratio`` times faster than the median it had (a backend
    that got much faster is worth re-measuring for routes that rank by TTFT)."""
    ttft = attempt.ttft_s
    if attempt.status != "ok" or ttft is None:
        return False
    if not bar.excluded:
        return median_ttft_s is not None and ttft <= median_ttft_s * ratio
    if bar.ttft_s is not None and ttft > bar.ttft_s:
        return False
    if bar.decode_tokens_per_s is not None:
        speed = attempt.decode_tokens_per_s
        return speed is not None and speed >= bar.decode_tokens_per_s
    return True


class SpellWatch:
    """One backend's answers in a row within its bar: after ``needed`` of them the slow spell is over
    from the first one's sending on (``over_at``); attempts started before then belong to the spell."""

    __slots__ = ("_speeds", "bar", "excluded_since", "needed", "over_at", "since", "streak")

    def __init__(self) -> None:
        self.bar = NOT_EXCLUDED  # what an answer must show while routes exclude the backend
        self.needed = 2
        # When routes began to exclude the backend: a user's attempt sent before then was sent to a
        # backend they still took, and says nothing about whether what made them leave is over.
        self.excluded_since = -math.inf
        self.since: float | None = None  # when the first answer of the streak was sent
        self.streak = 0
        self._speeds: list[float] = []  # decode speeds the streak measured, when a route asks for speed
        self.over_at = -math.inf

    def set_bar(self, bar: RecoveryBar, needed: int, now: float) -> None:
        """The prober's current bar (``now`` on the stats' clock): an exclusion begins when it turns on."""
        if bar.excluded and not self.bar.excluded:
            self.excluded_since = now
        self.bar, self.needed = bar, needed

    @property
    def recovering(self) -> bool:
        return self.streak > 0

    def user_answered(self, attempt: Attempt) -> float | None:
        """A user's answer (another route's traffic) counts like a probe while the backend is excluded."""
        if attempt.probe or not self.bar.excluded or attempt.status not in ("ok", "timeout"):
            return None
        if attempt.started_at < max(self.over_at, self.excluded_since):
            return None  # from the spell, or in flight when the routes left: not a new measurement
        return self.answered(attempt, self.bar, None, 1.0, self.needed, attempt.started_at)

    def answered(
        self,
        attempt: Attempt,
        bar: RecoveryBar,
        median: float | None,
        ratio: float,
        needed: int,
        sent_at: float,
    ) -> float | None:
        """Count one answer; returns when the spell ended once this one confirms it, else None."""
        if not answered_within(attempt, bar, median, ratio):
            self.since, self.streak, self._speeds = None, 0, []
            return None
        if self.since is None:
            self.since = sent_at
        self.streak += 1
        speed = attempt.decode_tokens_per_s if bar.decode_tokens_per_s is not None else None
        if speed is not None:
            self._speeds.append(speed)
        if self.streak < needed:
            return None
        self.over_at, self.since, self.streak = self.since, None, 0
        self.bar = NOT_EXCLUDED  # until the prober looks again
        return self.over_at

    def take_speeds(self) -> list[float]:
        speeds, self._speeds = self._speeds, []
        return speeds
