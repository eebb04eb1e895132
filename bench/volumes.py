"""The ledger and its readers at production volume: ``python -m bench.volumes``.

1. Two month-long ledgers (``bench/ledger_volume.py``): 10M rows in a PostgreSQL database of this
   run's own (COPY; dropped at the end unless ``--keep``; or ``--pg-url`` an existing one) and 1M
   rows in a SQLite file (or ``--sqlite`` an existing one). Each is loaded in the schema before the
   spend rollup and then opened, so the rollup's migration sums the rows already there.
2. On each: ``gateway spend``'s report (``build_report``: every ``--by``, over 24h, 7d and 30d), the
   dashboard's ledger read (``LedgerView.read``: today's totals by route, backend and replica, the
   refusals, the last hour's buckets, the newest rows), and the budgets' seed at start-up (day, week
   and month totals per route and key), timed; then the same totals by a full scan (the reference),
   checked equal (counts and tokens exactly, USD to 1e-9) and the ratio printed. One ``gateway spend``
   process is timed too (its Python start-up included).
3. The real ledger writer (``gateway/ledger/writer.py``, the policy's default batch and interval)
   fed ``--writer-rate`` rows per second (2,000) from an event loop, as settled requests feed it, into
   the PostgreSQL ledger for ``--writer-seconds`` (600): its queue depth and lag each second, then
   the rows counted in the database, which must be the rows appended.

4. The simulator at volume: ``python -m bench.simspeed`` (kimi-day at 1x, 4x and 16x of its traffic through
   the gateway's own decision: simulated requests per CPU second and how far from linear), run as a
   process of its own so its CPU is its own.

Query times are wall-clock on whatever machine runs it: say its load when quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.ledger_volume import month_rows, write
from gateway.ledger import LedgerDatabase, LedgerRow, open_database
from gateway.ledger.prune import same_total
from gateway.ledger.settings import open_ledger
from gateway.metrics.ledger_view import LedgerView
from gateway.money.budgets import _period_totals
from gateway.money.spend import build_report
from gateway.policy.schema import Ledger as LedgerSettings

BY = ("route", "backend", "key", "replica", "user")
WINDOWS = (("24h", 86_400), ("7d", 7 * 86_400), ("30d", 30 * 86_400))
SERVER_URL = os.environ.get("GATEWAY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def backend_cpu_s(pid: int | None) -> float:
    """CPU seconds a PostgreSQL backend on this machine has used (0 where it is not here to read)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Metered:
    """A ledger database whose readers' CPU is counted: this process's, and the PostgreSQL backend's
    that served each reader (read from /proc while its connection is open). On a loaded machine a
    query's wall time is mostly waiting for a core; its CPU is what it costs."""

    def __init__(self, database: LedgerDatabase) -> None:
        self.database = database
        self.server_cpu_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.database, name)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        with self.database.reading() as reader:
            pid = int(reader.query("SELECT pg_backend_pid()")[0][0]) if self.database.shared else None
            started = backend_cpu_s(pid)
            try:
                yield reader
            finally:
                self.server_cpu_s += backend_cpu_s(pid) - started


@dataclass(frozen=True, slots=True)
class Timing:
    wall_s: float
    cpu_s: float  # this process's and the database server's

    def __str__(self) -> str:
        return f"{self.wall_s:6.3f} ({self.cpu_s:5.3f})"


def timed(database: Metered, call: Callable[[Metered], Any]) -> tuple[Timing, Any]:
    server, wall, cpu = database.server_cpu_s, time.perf_counter(), time.process_time()
    result = call(database)
    cpu_s = time.process_time() - cpu + database.server_cpu_s - server
    return Timing(time.perf_counter() - wall, cpu_s), result


def queries(plain: LedgerDatabase, label: str) -> list[str]:
    """Time every report over one ledger; lines to print."""
    database = Metered(plain)
    now = time.time()
    lines = [f"\n## {label}: {database.location}"]
    with database.reading() as reader:
        rows = reader.query("SELECT count(*) FROM requests")[0][0]
        rollup = reader.query("SELECT count(*) FROM spend_rollup")[0][0]
    lines.append(f"rows: {rows:,}; rollup rows: {rollup:,}")
    lines.append("gateway spend (build_report), seconds wall (CPU: this process + the database server):")
    lines.append("  by        " + "".join(f"{name:>16}" for name, _ in WINDOWS))
    slowest: list[Timing] = []
    for by in BY:
        cells = []
        for _, span in WINDOWS:
            timing, _ = timed(
                database, lambda d, by=by, span=span: build_report(d, by, now - span, now, None)
            )
            slowest.append(timing)
            cells.append(f"{timing!s:>16}")
        lines.append(f"  {by:<8}  " + "".join(cells))
    view = LedgerView(database, time.time)  # type: ignore[arg-type]
    timing, snapshot = timed(database, lambda d: view.read(time.time()))
    assert snapshot.error is None, snapshot.error
    lines.append(f"dashboard ledger read (LedgerView.read, /dashboard/data's ledger part): {timing} s")
    slowest.append(timing)
    timing, _ = timed(database, lambda d: _period_totals(d, time.time()))
    lines.append(f"budgets' seed at start-up (day, week, month by route and key): {timing} s")
    slowest.append(timing)
    worst_wall = max(t.wall_s for t in slowest)
    worst_cpu = max(t.cpu_s for t in slowest)
    lines.append(f"slowest report: {worst_wall:.3f} s wall; most CPU: {worst_cpu:.3f} s")
    lines.append("full scan (the old query) for the 30d window, and the rollup's answer checked against it:")
    since = now - 30 * 86_400
    for by in BY:
        rolled_t, rolled = timed(database, lambda d, by=by: _read(d, lambda r: r.totals(by, since, now)))
        scan_t, scanned = timed(database, lambda d, by=by: _read(d, lambda r: r.scan_totals(by, since, now)))
        equal = {t.key: t for t in scanned}
        exact = len(rolled) == len(scanned) and all(same_total(t, equal.get(t.key)) for t in rolled)
        ratio = scan_t.cpu_s / rolled_t.cpu_s if rolled_t.cpu_s else float("inf")
        lines.append(
            f"  {by:<8} rollup {rolled_t} s  scan {scan_t} s  (CPU {ratio:,.0f}x)  "
            f"{len(rolled):,} keys, {'equal' if exact else 'DIFFERENT'}"
        )
        if not exact:
            raise SystemExit(f"the rollup's totals by {by} differ from a full scan's")
    return lines


def _read(database: Metered, call: Callable[[Any], Any]) -> Any:
    with database.reading() as reader:
        return call(reader)


def spend_process(target: str) -> str:
    """One `gateway spend` as a process, Python start-up and imports included."""
    command = [sys.executable, "-m", "gateway", "spend", "--by", "user", "--since", "30d", "--ledger", target]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"gateway spend failed: {done.stderr}")
    lines = done.stdout.count("\n")
    return f"`gateway spend --by user --since 30d` as a process: {seconds:.2f} s wall ({lines} lines)"


@dataclass
class Sample:
    at: float
    depth: int
    lag_s: float
    written: int


async def feed_writer(url: str, rate: int, seconds: float, batch_size: int) -> list[str]:
    """The real writer at ``rate`` rows/s for ``seconds``; lines to print."""
    templates = [LedgerRow(*row[:-1]) for row in next(month_rows(20_000, time.time(), seed=99, chunk=20_000))]
    run = uuid.uuid4().hex[:8]
    rolled = "SELECT coalesce(sum(requests), 0) FROM spend_rollup WHERE dimension = 'route' AND hours = 24"
    with open_database(url).reading() as reader:
        rolled_before = int(reader.query(rolled)[0][0])
    ledger = open_ledger(LedgerSettings(batch_size=batch_size), url)
    await ledger.start()
    backends = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = ?"
    with open_database(url).reading() as reader:
        pids = [int(pid) for (pid,) in reader.query(backends, ("gateway-ledger",))]
    server_started = sum(backend_cpu_s(pid) for pid in pids)
    cpu_started = time.process_time()
    loop = asyncio.get_running_loop()
    samples: list[Sample] = []
    appended = 0
    started = loop.time()
    next_sample = started + 1.0
    next_print = started + 10.0
    lines = [
        f"\n## writer: {rate:,} rows/s for {seconds:.0f} s, batch_size {batch_size:,}, into {ledger.location}"
    ]
    while (now := loop.time()) - started < seconds:
        due = int((now - started) * rate)
        wall = time.time()
        while appended < due:
            template = templates[appended % len(templates)]
            ledger.append(template._replace(time=wall, request_id=f"wr-{run}-{appended}"))
            appended += 1
        if now >= next_sample:
            oldest = ledger.oldest_pending_since
            samples.append(
                Sample(
                    now - started,
                    ledger.pending,
                    0.0 if oldest is None else wall - oldest,
                    ledger.rows_written,
                )
            )
            next_sample += 1.0
        if now >= next_print:
            last = samples[-1]
            print(
                f"  {last.at:5.0f} s: appended {appended:,}, written {last.written:,}, "
                f"queue {last.depth:,}, lag {last.lag_s:.2f} s",
                flush=True,
            )
            next_print += 10.0
        await asyncio.sleep(0.005)
    with open_database(url).reading() as reader:
        pids = list({*pids, *(int(pid) for (pid,) in reader.query(backends, ("gateway-ledger",)))})
    server_cpu_s = sum(backend_cpu_s(pid) for pid in pids) - server_started
    process_cpu_s = time.process_time() - cpu_started
    closing = loop.time()
    await ledger.close()
    close_s = loop.time() - closing
    database = open_database(url)
    with database.reading() as reader:
        counted = reader.query("SELECT count(*) FROM requests WHERE request_id LIKE ?", (f"wr-{run}-%",))[0][
            0
        ]
        in_rollup = int(reader.query(rolled)[0][0]) - rolled_before
    depths = [s.depth for s in samples]
    server_row_s = server_cpu_s / max(1, ledger.rows_written)
    process_row_s = process_cpu_s / max(1, appended)
    lags = sorted(s.lag_s for s in samples)
    lines += [
        f"appended {appended:,} rows ({appended / seconds:,.0f}/s); written {ledger.rows_written:,}; "
        f"dropped {ledger.rows_dropped}; write errors {ledger.write_errors}",
        f"queue depth: max {max(depths, default=0):,}, "
        f"median {statistics.median(depths) if depths else 0:,.0f} "
        f"(bound {200_000:,}); lag: median {statistics.median(lags) if lags else 0:.2f} s, "
        f"p99 {lags[int(0.99 * (len(lags) - 1))] if lags else 0:.2f} s, max {max(lags, default=0):.2f} s",
        f"close wrote the rest in {close_s:.2f} s",
        f"CPU per row while it ran: the database server's {server_row_s * 1e6:.0f} us (its writer "
        f"connections), this process's {process_row_s * 1e6:.0f} us (feeding and the writer thread): "
        f"at {rate:,} rows/s, {server_row_s * rate:.0%} and {process_row_s * rate:.0%} of a core",
        f"rows in the database with this run's ids: {counted:,} = appended {appended:,}: "
        f"{'yes' if counted == appended else 'NO'}; the rollup grew by {in_rollup:,}",
    ]
    if counted != appended or in_rollup != appended:
        raise SystemExit("the writer lost rows")
    return lines


def scratch_url() -> tuple[str, str]:
    name = f"gateway_volumes_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(SERVER_URL)
    return name, urlunsplit(parts._replace(path=f"/{name}"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-rows", type=int, default=10_000_000)
    parser.add_argument("--sqlite-rows", type=int, default=1_000_000)
    parser.add_argument("--pg-url", help="an existing ledger to read (and write the writer's rows into)")
    parser.add_argument("--sqlite", help="an existing SQLite ledger to read")
    parser.add_argument("--writer-seconds", type=float, default=600.0)
    parser.add_argument("--writer-rate", type=int, default=2000)
    parser.add_argument(
        "--writer-batch",
        type=int,
        default=5000,
        help="the policy's ledger.batch_size: most rows per transaction (the default policy's is 500)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the ledgers this run made")
    parser.add_argument("--skip", action="append", default=[], choices=["pg", "sqlite", "writer", "sim"])
    args = parser.parse_args()
    import psycopg

    lines: list[str] = []
    made: str | None = None
    url = args.pg_url
    try:
        if url is None and ("pg" not in args.skip or "writer" not in args.skip):
            made, url = scratch_url()
            with psycopg.connect(SERVER_URL, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{made}"'.encode())
            print(f"loading {args.pg_rows:,} rows into {made}...", flush=True)
            loaded = write(url, args.pg_rows, time.time())
            lines.append(
                f"PostgreSQL: {args.pg_rows:,} rows loaded by COPY in {loaded.load_s:.0f} s, "
                f"the rollup's migration over them {loaded.migrate_s:.0f} s"
            )
        if "pg" not in args.skip:
            lines += queries(open_database(url), "PostgreSQL")
            lines.append(spend_process(url))
        if "sqlite" not in args.skip:
            path = args.sqlite
            if path is None:
                path = str(
                    Path(os.environ.get("TMPDIR", "/tmp")) / f"gateway-volumes-{uuid.uuid4().hex[:8]}.sqlite3"
                )
                print(f"loading {args.sqlite_rows:,} rows into {path}...", flush=True)
                loaded = write(Path(path), args.sqlite_rows, time.time())
                lines.append(
                    f"SQLite: {args.sqlite_rows:,} rows loaded in {loaded.load_s:.0f} s, "
                    f"the rollup's migration over them {loaded.migrate_s:.0f} s"
                )
            lines += queries(open_database(Path(path)), "SQLite")
            lines.append(spend_process(path))
            if args.sqlite is None and not args.keep:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
        if "sim" not in args.skip:
            print("the simulator at 1x, 4x and 16x (python -m bench.simspeed)...", flush=True)
            simulated = subprocess.run(
                [sys.executable, "-m", "bench.simspeed"], capture_output=True, text=True, check=True
            )
            lines += ["simulator (python -m bench.simspeed):", *simulated.stdout.splitlines()]
        if "writer" not in args.skip:
            lines += asyncio.run(feed_writer(url, args.writer_rate, args.writer_seconds, args.writer_batch))
    finally:
        if made is not None and not args.keep:
            with psycopg.connect(SERVER_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)'.encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
