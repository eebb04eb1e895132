"""A ledger window as advise's run, read a day at a time: the summary is summed by the database day by
day (per hour and route: requests and output tokens; per route, where some row answered nothing: how
often each answer length was seen), so no request row is held for it; then only the sampled days'
rows are read, one day per query. A month of 3.7M rows is never in memory; ``--full-replay`` still
reads it whole.

The requests are those ``gateway simulate --workload ledger:`` replays (``simulate/replay.py``), to
the float: the run starts at the window's first row and lasts until a second after its last; a row
that did not answer (or answered nothing) gets its route's median answer length over the window."""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gateway.advise.runs import RunSummary, day_cuts
from gateway.advise.traffic import HOUR_S, HourTraffic
from gateway.ledger import LedgerUnavailable, is_url, open_database
from gateway.ledger.reader import LedgerReader
from gateway.simulate.replay import FALLBACK_OUTPUT_TOKENS, TAIL_S, ledger_workload
from gateway.simulate.workload import BackendModel, SimRequest, Workload, WorkloadError

# A row whose answer length the replay takes as it is; any other gets its route's median.
ANSWERED = "status = 'ok' AND completion_tokens > 0"
REPLAYED = "time >= ? AND status <> 'refused'"  # what replay_rows reads: refusals never reached a backend
# A day's rows: an index range a little wider than the day (EDGE_S each side), cut exactly where the
# run's own clock (seconds since its first row, as the replay computes them) crosses the day's bounds.
EDGE_S = 1.0
DAY_ROWS = f"{REPLAYED} AND time < ? AND time - ? >= ? AND time - ? < ?"
LENGTHS = (
    f"SELECT route, completion_tokens, count(*) FROM requests WHERE {REPLAYED} AND {ANSWERED} GROUP BY 1, 2"
)


class LedgerRun:
    """``gateway advise --ledger PATH --since ...``'s traffic. ``rows_read`` counts the request rows
    read from the ledger (the summary's sums are not rows), ``largest_read`` the most in one read."""

    backends: Mapping[str, BackendModel] = {}

    def __init__(self, path: str | Path, since: float) -> None:
        if not is_url(path) and not Path(path).is_file():
            raise WorkloadError(f"ledger {path}: no such file")
        self.path, self.since = path, since
        self.name = f"ledger:{path}"
        self.rows_read = 0
        self.largest_read = 0
        self._medians: dict[str, int] | None = None
        self._summary: RunSummary | None = None
        first, last = self._one(f"SELECT min(time), max(time) FROM requests WHERE {REPLAYED}", (since,))
        if first is None:
            raise WorkloadError(f"ledger {path}: no requests in the window asked for (--since)")
        self.start_wall = float(first)
        self.duration_s = float(last) - self.start_wall + TAIL_S

    def summary(self) -> RunSummary:
        """Summed once, on first asking."""
        if self._summary is None:
            self.sum_days()
        assert self._summary is not None
        return self._summary

    def sum_days(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Sum the window day by day for the summary; ``progress(days done, days)`` after each day (a
        month of millions of rows takes seconds, which a bar should show)."""
        hours = max(1, math.ceil(self.duration_s / HOUR_S))
        requests: list[dict[str, int]] = [{} for _ in range(hours)]
        answered: list[dict[str, int]] = [{} for _ in range(hours)]  # output tokens of answered rows
        unanswered: list[dict[str, int]] = [{} for _ in range(hours)]  # rows that take the median
        lengths: dict[str, Counter[int]] = {}
        day_requests = []
        with self._reading() as reader:
            by_hour = (
                f"SELECT {_hour_of(reader)}, route, count(*),"
                f" sum(CASE WHEN {ANSWERED} THEN completion_tokens ELSE 0 END),"
                f" sum(CASE WHEN {ANSWERED} THEN 0 ELSE 1 END) FROM requests WHERE {DAY_ROWS} GROUP BY 1, 2"
            )
            cuts = day_cuts(self.start_wall, self.duration_s)
            for start, end in cuts:
                day = 0
                for h, route, n, tokens, others in reader.query(
                    by_hour, self._day_params(start, end, hour=True)
                ):
                    h = min(hours - 1, int(h))
                    requests[h][route] = requests[h].get(route, 0) + int(n)
                    answered[h][route] = answered[h].get(route, 0) + int(tokens)
                    unanswered[h][route] = unanswered[h].get(route, 0) + int(others)
                    day += int(n)
                day_requests.append(day)
                if progress is not None:
                    progress(len(day_requests), len(cuts))
            if any(any(hour.values()) for hour in unanswered):  # only they need their route's median
                for route, tokens, n in reader.query(LENGTHS, (self.since,)):
                    lengths.setdefault(route, Counter())[int(tokens)] += int(n)
        self._medians = {route: _median(counts) for route, counts in lengths.items()}
        traffic = []
        for n, a, u in zip(requests, answered, unanswered, strict=True):
            tokens = {r: a.get(r, 0) + u.get(r, 0) * self._median_of(r) for r in n}
            traffic.append(HourTraffic(n, tokens))
        self._summary = RunSummary(traffic, day_requests, sum(day_requests))

    def day(self, start_s: float, end_s: float) -> Workload:
        if self._medians is None:
            self.summary()
        query = (
            "SELECT time, route, stream, prompt_tokens, completion_tokens, reasoning_tokens, status"
            f" FROM requests WHERE {DAY_ROWS} ORDER BY time"
        )
        with self._reading() as reader:
            rows = reader.query(query, self._day_params(start_s, end_s))
        self.rows_read += len(rows)
        self.largest_read = max(self.largest_read, len(rows))
        requests = []
        for t, route, stream, prompt, completion, reasoning, status in rows:
            output = int(completion)
            if status != "ok" or output <= 0:
                output = self._median_of(route)
            at = (float(t) - self.start_wall) - start_s  # as the whole run's request moved to the day
            requests.append(
                SimRequest(at, route, int(prompt), output, min(int(reasoning), output), None, bool(stream))
            )
        return Workload(self.name, requests, end_s - start_s, self.start_wall + start_s, {}, (), 0)

    def whole(self) -> Workload:
        workload = ledger_workload(self.path, self.since)
        self.rows_read += len(workload.requests)
        self.largest_read = max(self.largest_read, len(workload.requests))
        return workload

    def _median_of(self, route: str) -> int:
        assert self._medians is not None
        return self._medians.get(route, FALLBACK_OUTPUT_TOKENS)

    def _day_params(self, start_s: float, end_s: float, *, hour: bool = False) -> tuple[Any, ...]:
        wall = self.start_wall
        bounds = (max(self.since, wall + start_s - EDGE_S), wall + end_s + EDGE_S)
        return ((wall,) if hour else ()) + bounds + (wall, start_s, wall, end_s)

    def _one(self, query: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
        with self._reading() as reader:
            rows = reader.query(query, params)
        return tuple(rows[0])

    def _reading(self) -> contextlib.AbstractContextManager[LedgerReader]:
        return _reading(self.path)


@contextlib.contextmanager
def _reading(path: str | Path) -> Iterator[LedgerReader]:
    try:
        with open_database(path).reading() as reader:
            yield reader
    except LedgerUnavailable as exc:
        raise WorkloadError(f"ledger {path}: cannot read it: {exc}") from None


def _hour_of(reader: LedgerReader) -> str:
    """The hour of the run a row arrived in (the replay's ``int(at // 3600)``; ``at`` >= 0)."""
    if reader.dialect.name == "postgresql":
        return f"floor((time - ?) / {HOUR_S})"
    return f"CAST((time - ?) / {HOUR_S} AS INTEGER)"


def _median(counts: Counter[int]) -> int:
    """``int(statistics.median(values))`` of the values counted."""
    ordered = sorted(counts.items())
    n = sum(counts.values())
    middle = [(n - 1) // 2, n // 2]
    found: list[int] = []
    seen = 0
    for value, count in ordered:
        while len(found) < 2 and middle[len(found)] < seen + count:
            found.append(value)
        seen += count
    return int((found[0] + found[1]) / 2) if found[0] != found[1] else found[0]
