"""The run advise plans for, as the plan search reads it: a summary of the whole run (its hours'
traffic, each day's requests) and, on demand, one day's requests or all of them. A workload held in
memory answers from its list; a ledger (``ledger_run.py``) answers by reading one day at a time, so a
month is never held whole unless ``--full-replay`` asks for one replay of all of it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.advise.schedule import DAY_S
from gateway.advise.traffic import HourTraffic, hourly_traffic
from gateway.simulate.workload import BackendModel, Fault, Workload, requests_between


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What the capacity model and the day sampler need of the whole run: no request is kept."""

    hours: list[HourTraffic]  # from the run's start, the last perhaps partial
    day_requests: list[int]  # per day cut at UTC midnights (``day_cuts``)
    requests: int


class Run(Protocol):
    """A run of traffic: its timeline and models, its summary, and its requests a day or all at once."""

    @property
    def name(self) -> str: ...
    @property
    def start_wall(self) -> float: ...  # Unix seconds of the run's start
    @property
    def duration_s(self) -> float: ...
    @property
    def backends(self) -> Mapping[str, BackendModel]: ...

    def summary(self) -> RunSummary:
        """The whole run summed (once: asked again, the same answer)."""
        ...

    def day(self, start_s: float, end_s: float) -> Workload:
        """The requests arriving in [start_s, end_s) of the run, as a run of their own from zero."""
        ...

    def whole(self) -> Workload:
        """Every request of the run (``--full-replay``)."""
        ...


def day_cuts(start_wall: float, duration_s: float) -> list[tuple[float, float]]:
    """The run cut at each UTC midnight inside it."""
    cuts, at = [], 0.0
    while at < duration_s:
        wall = start_wall + at
        end = min(duration_s, at + (DAY_S - wall % DAY_S))
        cuts.append((at, end))
        at = end
    return cuts


def workload_day(workload: Workload, start: float, end: float, faults: tuple[Fault, ...]) -> Workload:
    """``workload``'s requests in [start, end) moved to start at zero, with the day's ``faults``."""
    arrived = requests_between(workload.requests, start, end, last=False)
    requests = [r._replace(at=r.at - start) for r in arrived]
    return workload._replace(
        requests=requests, duration_s=end - start, start_wall=workload.start_wall + start, faults=faults
    )


def day_faults(faults: tuple[Fault, ...], start: float, end: float) -> tuple[Fault, ...]:
    """The faults overlapping [start, end), cut to it and moved to start at zero."""
    return tuple(
        f.model_copy(update={"start_s": max(f.start_s, start) - start, "end_s": min(f.end_s, end) - start})
        for f in faults
        if f.start_s < end and f.end_s > start
    )


class WorkloadRun:
    """A workload held in memory (a synthetic one, or a ledger read whole)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.name = workload.name
        self.start_wall = workload.start_wall
        self.duration_s = workload.duration_s
        self.backends = workload.backends
        self._summary: RunSummary | None = None

    def summary(self) -> RunSummary:
        if self._summary is None:
            self._summary = self._count()
        return self._summary

    def _count(self) -> RunSummary:
        cuts = day_cuts(self.start_wall, self.duration_s)
        counts = [0] * len(cuts)
        day = 0
        for req in self.workload.requests:  # in arrival order
            while req.at >= cuts[day][1] and day < len(cuts) - 1:
                day += 1
            counts[day] += 1
        return RunSummary(hourly_traffic(self.workload), counts, len(self.workload.requests))

    def day(self, start_s: float, end_s: float) -> Workload:
        return workload_day(self.workload, start_s, end_s, day_faults(self.workload.faults, start_s, end_s))

    def whole(self) -> Workload:
        return self.workload
