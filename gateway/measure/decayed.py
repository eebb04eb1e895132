"""Time-decayed measurements: the last samples of a value, weighed by age for quantiles, and decayed
means (rates are means of 0/1). Plain arithmetic on (time, value) pairs; the caller owns the clock.
"""

from __future__ import annotations

import bisect
import itertools
from typing import ClassVar


class DecayedSamples:
    """The last ``window`` values; quantiles weigh each one by half every ``half_life_s`` of its age.

    The values are also kept sorted with their weights, ``2 ** ((t - base) / half_life_s)`` fixed when
    each arrives: scaling all weights alike leaves quantiles unchanged, so a quantile is one walk of
    running sums (no power or sort per look). ``base`` moves up before the weights could overflow.
    The running sums are kept up to the first place a sample went in or out since the last look, and
    only the rest is summed again (the same additions in the same order: the same floats as summing
    them all).
    """

    __slots__ = ("_base", "_half_life_s", "_next", "_running", "_sorted", "_sorted_weights", "_times",
                 "_values", "_window")  # fmt: skip

    # Half-lives between base and the newest sample before the weights are rebased (2**REBASE is far
    # from a float's limit; any window of samples spans many fewer half-lives in practice).
    REBASE: ClassVar[float] = 256.0  # a class attribute when compiled too (gateway/native.py)

    def __init__(self, window: int, half_life_s: float) -> None:
        self._window = window
        self._half_life_s = half_life_s
        self._values: list[float] = []
        self._times: list[float] = []
        self._next = 0
        self._base: float | None = None
        self._sorted: list[float] = []  # the values in order
        self._sorted_weights: list[float] = []  # their weights, in the same order
        self._running: list[float] = []  # their running sums, as far as still true

    def __len__(self) -> int:
        return len(self._values)

    def _weight(self, at: float) -> float:
        base = self._base
        if base is None or (at - base) / self._half_life_s > self.REBASE:
            self._rebase(at)
            base = at
        weight: float = 2.0 ** ((at - base) / self._half_life_s)
        return weight

    def _rebase(self, at: float) -> None:
        self._base = at
        half_life = self._half_life_s
        pairs = sorted(
            (v, 2.0 ** ((t - at) / half_life)) for t, v in zip(self._times, self._values, strict=True)
        )
        self._sorted = [v for v, _ in pairs]
        self._sorted_weights = [w for _, w in pairs]
        self._running = []

    def add(self, at: float, value: float) -> None:
        weight = self._weight(at)
        ordered, weights = self._sorted, self._sorted_weights
        if len(self._values) < self._window:
            self._values.append(value)
            self._times.append(at)
        else:
            slot = self._next
            base = self._base
            assert base is not None  # set by _weight
            old = self._values[slot]
            old_weight = 2.0 ** ((self._times[slot] - base) / self._half_life_s)
            i = bisect.bisect_left(ordered, old)
            while weights[i] != old_weight and i + 1 < len(ordered) and ordered[i + 1] == old:
                i += 1  # equal values: the one with its weight
            del ordered[i], weights[i]
            del self._running[i:]
            self._values[slot] = value
            self._times[slot] = at
            self._next = (slot + 1) % self._window
        i = bisect.bisect_right(ordered, value)
        ordered.insert(i, value)
        weights.insert(i, weight)
        del self._running[i:]

    def forget_before(self, at: float) -> None:
        """Drop every sample older than ``at`` (a slow spell that probes showed is over)."""
        kept = [(t, v) for t, v in zip(self._times, self._values, strict=True) if t >= at]
        self._times = [t for t, _ in kept]
        self._values = [v for _, v in kept]
        if len(kept) < self._window:
            self._next = 0  # not full any more: new samples are appended again
        if self._base is not None:
            self._rebase(self._base)

    def quantiles(self, *qs: float) -> tuple[float, ...] | None:
        ordered = self._sorted
        if not ordered:
            return None
        weights, running = self._sorted_weights, self._running
        kept = len(running)
        if kept < len(weights):  # summed again from the first place that changed
            if kept:
                sums = itertools.accumulate(itertools.islice(weights, kept, None), initial=running[-1])
                next(sums)  # the initial value itself
                running.extend(sums)
            else:
                running.extend(itertools.accumulate(weights))
        # The total is the last running sum (not a separate exact ``fsum``, which cost as much as the
        # running sums: the two differ in rounding only). The first value whose running weight
        # reaches q of the total.
        # (``hi=last`` keeps the index on the last value should rounding put q * total past its sum.)
        total, last = running[-1], len(ordered) - 1
        return tuple([ordered[bisect.bisect_left(running, q * total, 0, last)] for q in qs])


class DecayedMean:
    """A mean in which each value's weight halves every ``half_life_s``; rates are means of 0/1.

    ``value`` (None before the first value) is worked out when a value is added, not when read: a
    backend's view reads each of its means every time it is built, several times per add.
    """

    __slots__ = ("_at", "_half_life_s", "_sum", "_weight", "value")

    def __init__(self, half_life_s: float) -> None:
        self._half_life_s = half_life_s
        self._sum = 0.0
        self._weight = 0.0
        self._at = 0.0
        self.value: float | None = None

    def add(self, at: float, value: float) -> None:
        elapsed = at - self._at
        if elapsed > 0:
            decay = 0.5 ** (elapsed / self._half_life_s)
            self._at = at
            self._sum = self._sum * decay + value
            self._weight = self._weight * decay + 1.0
        else:  # no time passed (or an older value): nothing decays, as a decay of exactly 1.0 would
            self._sum += value
            self._weight += 1.0
        self.value = self._sum / self._weight  # at least 1 once a value is in
