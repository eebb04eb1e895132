"""An hour-of-day schedule: when each replica of a pool is up, booted one boot time ahead of the hour
it is needed, stopped (after draining) when it stops paying for itself; and the same schedule laid on
the run's days as the windows a simulation turns on and off."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

DayKind = Literal["every day", "Mon-Fri", "Sat-Sun"]

HOURS_PER_DAY = 24
DAY_S = 86_400.0
# An off spell shorter than this is not worth a stop and a boot: the replica stays up through it.
MERGE_GAP_H = 2
DRAIN_S = 600.0  # a stopped replica takes no new streams and finishes those it holds


@dataclass(frozen=True, slots=True)
class Window:
    """One replica up from ``ready_h`` to ``stop_h`` (hours of the day, UTC), booting before."""

    replica: int  # 1-based
    ready_h: int
    stop_h: int
    boot_s: float
    days: DayKind = "every day"

    def boot_clock(self) -> str:
        return clock_of(self.ready_h * 3600.0 - self.boot_s)

    def describe(self) -> str:
        if self.ready_h == 0 and self.stop_h == HOURS_PER_DAY:
            return f"replica {self.replica}, {self.days}: always on"
        ready, stop = clock_of(self.ready_h * 3600.0), clock_of(self.stop_h * 3600.0)
        return (
            f"replica {self.replica}, {self.days}: boot at {self.boot_clock()} to be ready at {ready},"
            f" stop at {stop}"
        )


def clock_of(seconds_of_day: float) -> str:
    minutes = round(seconds_of_day / 60.0) % (24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def is_kind(wall: float, kind: DayKind) -> bool:
    weekend = time.gmtime(wall).tm_wday >= 5
    return kind == "every day" or (kind == "Sat-Sun") == weekend


def day_kinds(start_wall: float, duration_s: float) -> list[DayKind]:
    """Weekdays and weekends apart when the run saw a whole day of each; else one kind of day."""
    first_midnight = start_wall - start_wall % DAY_S + (DAY_S if start_wall % DAY_S else 0.0)
    whole = [
        first_midnight + d * DAY_S for d in range(int((start_wall + duration_s - first_midnight) // DAY_S))
    ]
    seen = {is_kind(m, "Sat-Sun") for m in whole}
    return ["Mon-Fri", "Sat-Sun"] if seen == {True, False} else ["every day"]


def hour_of_day_needs(
    per_run_hour: Sequence[int], start_wall: float, kind: DayKind = "every day"
) -> list[int]:
    """For each hour of the day, the most replicas any day of the run (of that kind) needed then."""
    needs = [0] * HOURS_PER_DAY
    for h, replicas in enumerate(per_run_hour):
        wall = start_wall + h * 3600.0
        if is_kind(wall, kind):
            hod = int((wall % DAY_S) // 3600.0)
            needs[hod] = max(needs[hod], replicas)
    return needs


def daily_windows(needs: Sequence[int], boot_s: float, days: DayKind = "every day") -> list[Window]:
    """Each replica's up spells over the day, gaps under ``MERGE_GAP_H`` hours bridged."""
    windows = []
    for replica in range(1, max(needs, default=0) + 1):
        spells: list[list[int]] = []
        for hour, need in enumerate(needs):
            if need < replica:
                continue
            if spells and hour - spells[-1][1] <= MERGE_GAP_H:
                spells[-1][1] = hour + 1
            else:
                spells.append([hour, hour + 1])
        windows += [Window(replica, a, b, boot_s, days) for a, b in spells]
    return windows


def has_daily_shape(needs: Sequence[int]) -> bool:
    return min(needs) != max(needs)


@dataclass(frozen=True, slots=True)
class UpSpell:
    """One replica up in run time: paid from ``paid_from_s`` (its boot), serving from ``ready_s`` to
    ``stop_s``, paid until ``paid_until_s`` (its drain)."""

    paid_from_s: float
    ready_s: float
    stop_s: float
    paid_until_s: float


def spells_in_run(
    windows: Sequence[Window], start_wall: float, duration_s: float
) -> Mapping[int, list[UpSpell]]:
    """The daily windows laid on every day the run touches, clipped to the run."""
    out: dict[int, list[UpSpell]] = {}
    first_midnight = -(start_wall % DAY_S)  # run time of the midnight on or before the start
    days = math.ceil((duration_s - first_midnight) / DAY_S)
    for day in range(days):
        midnight = first_midnight + day * DAY_S
        for w in windows:
            if not is_kind(start_wall + midnight, w.days):
                continue
            ready = midnight + w.ready_h * 3600.0
            stop = min(duration_s, midnight + w.stop_h * 3600.0)
            if stop <= 0 or ready >= duration_s:
                continue
            boot = ready - w.boot_s
            spell = (
                UpSpell(0.0, 0.0, stop, min(duration_s, stop + DRAIN_S))
                if boot <= 0
                else UpSpell(boot, ready, stop, min(duration_s, stop + DRAIN_S))
            )
            if w.stop_h == HOURS_PER_DAY and stop < duration_s:
                spell = UpSpell(spell.paid_from_s, spell.ready_s, stop, stop)  # goes on at midnight
            out.setdefault(w.replica, []).append(spell)
    return {replica: _joined(spells) for replica, spells in out.items()}


def _joined(spells: list[UpSpell]) -> list[UpSpell]:
    """Spells that touch (one day's last hour and the next day's first) are one."""
    spells = sorted(spells, key=lambda s: s.paid_from_s)
    joined = [spells[0]]
    for s in spells[1:]:
        last = joined[-1]
        if s.paid_from_s <= last.stop_s:
            joined[-1] = UpSpell(last.paid_from_s, last.ready_s, max(last.stop_s, s.stop_s),
                                 max(last.paid_until_s, s.paid_until_s))  # fmt: skip
        else:
            joined.append(s)
    return joined
