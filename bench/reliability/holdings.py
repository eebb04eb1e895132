"""What a gateway process holds, read from outside: file descriptors and sockets (/proc), PSS, and its
own admin view (``/dashboard/data``: requests in flight per backend, budget reservations, ledger rows
waiting); after a run it must hold no more than after warm-up. And the rows its SQLite ledger has."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.procs import Proc
from bench.reliability.process import open_fds, open_sockets, pss_bytes


@dataclass
class Holdings:
    fds: int
    sockets: int
    pss_bytes: int
    inflight: int  # attempts in flight, summed over backends
    reserved_usd: float  # budget reservations still held
    pending_rows: int  # ledger rows not yet written

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and self.reserved_usd <= 1e-12 and self.pending_rows == 0


def holdings(proc: Proc, url: str) -> Holdings:
    data = httpx.get(url + "/dashboard/data", timeout=30).json()
    return Holdings(
        fds=open_fds(proc.pid),
        sockets=open_sockets(proc.pid),
        pss_bytes=pss_bytes(proc.pid),
        inflight=sum(int(b["inflight"]) for b in data["backends"]),
        reserved_usd=sum(float(b["reserved_usd"]) for b in data["budgets"]),
        pending_rows=int(data["ledger"]["pending_rows"]),
    )


def settled(proc: Proc, url: str, baseline: Holdings, timeout_s: float = 30.0) -> Holdings:
    """Holdings once the process has let go of what the run used (bounded wait: idle connections in the
    upstream pool close on their own schedule), or as they are when the wait ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = holdings(proc, url)
        done = now.idle and now.fds <= baseline.fds and now.sockets <= baseline.sockets
        if done or time.monotonic() > deadline:
            return now
        time.sleep(0.25)


def leaks(baseline: Holdings, end: Holdings) -> list[str]:
    found = []
    if end.fds > baseline.fds:
        found.append(f"{end.fds - baseline.fds} file descriptors")
    if end.sockets > baseline.sockets:
        found.append(f"{end.sockets - baseline.sockets} sockets")
    if end.inflight:
        found.append(f"{end.inflight} attempts still in flight")
    if end.reserved_usd > 1e-12:
        found.append(f"${end.reserved_usd:.6f} of budget still reserved")
    if end.pending_rows:
        found.append(f"{end.pending_rows} ledger rows unwritten")
    return found


def ledger_rows(path: Path) -> int:
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT count(*) FROM requests").fetchone()[0])


def ledger_summary(path: Path) -> list[tuple[str, str, str | None, int]]:
    """(backend, status, error_type, rows) over the ledger, for the scenarios' per-case checks."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        query = "SELECT backend, status, error_type, count(*) FROM requests GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        return [(str(b), str(s), e, int(n)) for b, s, e, n in db.execute(query)]


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics, 0 when absent."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "") + " "
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def metric_total(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels`` (whatever their other labels)."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") and all(label in line for label in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total
