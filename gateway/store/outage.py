"""What a replica may spend of a budget while Redis is away (``on_failure: fail_open``), and how the
counters come back when Redis does.

While away, each replica admits on its own counts, but not against the whole cap: against its share
of what was left when it lost sight of Redis, ``(limit - spent then) / replicas`` (the replicas it
has heard from in the fleet's messages over the last ``LIVE_S``, itself included). So the replicas
together stay within the cap, up to what the fleet spent that the replica had not yet read when
Redis went (counters are re-read every second) and what reservations under-predict, as always.
A replica that starts during the outage knows no count and no peer: it may spend up to the cap
minus what its ledger holds (a shared ledger: the fleet's spend).

When Redis is back, each replica re-sends what it counted meanwhile (a ``Batch``, applied once).
If Redis came back empty (restarted without persistence, a failover to a replica that lacked the
data), each replica raises every counter to at least the ledger's total for the period
(``FLOOR_LUA``: a maximum, so every replica may do it, again each second for a while after). A raise
may count some spend twice: the ledger's total holds rows whose settlements another replica has not
yet sent (up to one ``sync_interval_s`` of its answers), and they are added again when it sends them.
That errs on the safe side (the budget refuses a little early, never late) and only while a raise
still raises (for ``FLOOR_AGAIN_FOR_S`` after the loss, while the ledger is ahead of the counter); the
exact alternative would need each settlement's time in Redis. With a shared ledger (the fleet's
spend) that is all: what a replica counted meanwhile is not sent, the ledger has it. With a ledger of
each replica's own, each also re-adds its spend since it started (spend by replicas since stopped is
then lost to the counters).

The bound on overspending a budget through a restart of Redis, per replica: the requests it had in
flight (their reservations went with Redis), plus those it answered whose ledger rows were not yet
written when it read the floor (one flush interval); tests/replicas/test_redis_restart_budget.py
holds a fleet to twice its clients' count of requests. Rate-limit windows are not restored: a key
may send up to twice its per-minute limit in the minute of the restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

LIVE_S = 30.0  # a replica not heard from for this long no longer takes a share


@dataclass(slots=True)
class Batch:
    """Settlements to apply together: (spent, reserved) deltas per counter, deltas per window bucket."""

    seq: int = 0
    counters: dict[str, list[float]] = field(default_factory=dict)
    windows: dict[tuple[str, int], float] = field(default_factory=dict)
    # Reservations whose admission timed out: (marker key, cap keys), released if the script ran.
    cancels: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.counters or self.windows or self.cancels)


LedgerTotals = Callable[[float], Mapping[str, float]]  # wall time -> each counter's spend per the ledger


class Replicas:
    """The fleet's replicas as this one hears them in the message board (its own included)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._heard: dict[str, float] = {}

    def heard(self, replica: str) -> None:
        self._heard[replica] = self._clock()

    def count(self) -> int:
        now = self._clock()
        for replica in [r for r, at in self._heard.items() if now - at > LIVE_S]:
            del self._heard[replica]
        return len(self._heard) + 1


class OutageShares:
    """Counters as a replica must judge them while Redis is away: its own count, plus the other
    replicas' shares of what was left at the outage's start, counted as if already spent."""

    def __init__(self) -> None:
        self._left_at_start: dict[str, float] = {}

    def began(self) -> None:
        self._left_at_start = {}

    def counters(
        self,
        keys: Sequence[str],
        limits: Sequence[float],
        read: Callable[[str], tuple[float, float]],
        replicas: int,
    ) -> Callable[[str], tuple[float, float]]:
        caps = dict(zip(keys, limits, strict=True))
        for key in keys:  # first seen in this outage: what was left then is what the fleet shares
            if key not in self._left_at_start:
                self._left_at_start[key] = max(0.0, caps[key] - read(key)[0])

        def judged(key: str) -> tuple[float, float]:
            spent, reserved = read(key)
            others = self._left_at_start[key] * (replicas - 1) / replicas
            return spent + others, reserved

        return judged
