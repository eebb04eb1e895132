"""Time-decayed measurements: the last samples of a value, weighed by age for quantiles, and decayed
means (rates are means of 0/1). Plain arithmetic on (time, value) pairs; the caller owns the clock.
"""

from __future__ import annotations

import math


class DecayedSamples:
    """The last ``window`` values; quantiles weigh each one by half every ``half_life_s`` of its age."""

    __slots__ = ("_half_life_s", "_next", "_times", "_values", "_window")

    def __init__(self, window: int, half_life_s: float) -> None:
        self._window = window
        self._half_life_s = half_life_s
        self._values: list[float] = []
        self._times: list[float] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._values)

    def add(self, at: float, value: float) -> None:
        if len(self._values) < self._window:
            self._values.append(value)
            self._times.append(at)
            return
        self._values[self._next] = value
        self._times[self._next] = at
        self._next = (self._next + 1) % self._window

    def forget_before(self, at: float) -> None:
        """Drop every sample older than ``at`` (a slow spell that probes showed is over)."""
        kept = [(t, v) for t, v in zip(self._times, self._values, strict=True) if t >= at]
        self._times = [t for t, _ in kept]
        self._values = [v for _, v in kept]
        if len(kept) < self._window:
            self._next = 0  # not full any more: new samples are appended again

    def quantiles(self, *qs: float) -> tuple[float, ...] | None:
        if not self._values:
            return None
        # Weights relative to the newest sample: scaling all weights alike leaves quantiles unchanged,
        # so the result depends on sample ages, not on when it is asked for.
        newest = max(self._times)
        half_life = self._half_life_s
        weights = [0.5 ** ((newest - t) / half_life) for t in self._times]
        order = sorted(range(len(self._values)), key=self._values.__getitem__)
        total = math.fsum(weights)
        results = []
        for q in qs:
            target = q * total
            cumulative = 0.0
            chosen = self._values[order[-1]]
            for i in order:
                cumulative += weights[i]
                if cumulative >= target:
                    chosen = self._values[i]
                    break
            results.append(chosen)
        return tuple(results)


class DecayedMean:
    """A mean in which each value's weight halves every ``half_life_s``; rates are means of 0/1."""

    __slots__ = ("_at", "_half_life_s", "_sum", "_weight")

    def __init__(self, half_life_s: float) -> None:
        self._half_life_s = half_life_s
        self._sum = 0.0
        self._weight = 0.0
        self._at = 0.0

    def add(self, at: float, value: float) -> None:
        decay = 0.5 ** (max(0.0, at - self._at) / self._half_life_s)
        self._at = max(at, self._at)
        self._sum = self._sum * decay + value
        self._weight = self._weight * decay + 1.0

    @property
    def value(self) -> float | None:
        return self._sum / self._weight if self._weight > 0 else None
