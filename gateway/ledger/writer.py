"""The ledger writer: rows appended in O(1) on the request path, written in batches by one background
thread to whichever database holds the ledger.

While the database is away (stopped, restarting, a SQLite file locked or its disk full) requests are
answered as ever: the writer keeps each cycle's rows in memory only until its next cycle (a flush
interval, or sooner when a batch is full), then moves them to the local spool (``spool.py``, fsynced
per move) and retries the database with backoff; once a write goes through it writes the spool's rows
too, oldest first. Every row has a key given once (``row_key``, unique in the database), so a batch
retried after an unclear failure, or written from the spool twice, is counted once.

A SIGKILL can lose the rows in memory: the current cycle's (a flush interval's, plus one failing
write). A SIGTERM loses nothing: ``close()`` writes or spools what it holds. When the spool fails too,
rows wait in memory up to a bound: billable rows ``MAX_PENDING_ROWS``, refusals their own
(``refused.py``); past it a kind drops its oldest row, logs and counts it. A refusal never takes a
billable row's place; a row the database cannot hold never stops the rest (``rejection.py``); a
shared database away at the start is opened later, its rows spooled meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from gateway.ledger.database import LedgerDatabase, LedgerUnavailable
from gateway.ledger.joining import joined
from gateway.ledger.opening import open_database
from gateway.ledger.refused import RefusedRows
from gateway.ledger.rejection import scrubbed, write_apart
from gateway.ledger.rows import COLUMNS, LedgerRow
from gateway.ledger.spool import Spool, spool_file, upgraded
from gateway.ledger.sqlite import SqliteLedger
from gateway.ledger.unwritten import UnwrittenRows

log = logging.getLogger("gateway.ledger")
refusal_log = logging.getLogger("gateway")  # where request/refusals.py says each refusal

# Billable rows held in memory while neither the database nor the spool takes them (~100 MB): past
# this the oldest is dropped (and counted), so a ledger that cannot write costs memory up to a limit.
MAX_PENDING_ROWS = 200_000
RETRY_MAX_S = 5.0
REPLAY_BATCHES_PER_CYCLE = 20  # spool rows written per cycle, so fresh rows are not held back long
DROP_LOG_S = 10.0
COUNT_INDEX = COLUMNS.index("request_count")

Keyed = tuple[Any, ...]  # a row with its row key appended: what the databases and the spool take


class Ledger:
    """Collects rows from the event loop and writes them from one thread, in batches.

    ``append`` only puts a tuple on a deque (``unwritten.py``) and, when a batch is full, wakes
    the writer; every other ``flush_interval_s`` the writer takes whatever is there.
    """

    def __init__(
        self,
        database: LedgerDatabase | Path | str,
        *,
        flush_interval_s: float = 1.0,
        batch_size: int = 500,
        close_timeout_s: float = 20.0,
        spool_dir: Path | None = None,
        max_pending_rows: int = MAX_PENDING_ROWS,
        refused: RefusedRows | None = None,
    ) -> None:
        self.database = open_database(database) if isinstance(database, str | Path) else database
        self.path = self.database.path if isinstance(self.database, SqliteLedger) else None
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._close_timeout_s = close_timeout_s
        self.spool = None if spool_dir is None else Spool(spool_file(spool_dir, self.database.location))
        self._unwritten = UnwrittenRows(max_pending_rows)  # billable rows
        self.refused = refused or RefusedRows()
        self._probes: deque[LedgerRow] = deque(maxlen=10_000)  # synthetic probes, apart
        # Being written now, with each row's key: kept and retried as is when a write fails.
        self._batch: list[Keyed] = []
        self._refused_batch: list[Keyed] = []
        # Random once per writer, then counted: unique across replicas and restarts without a
        # getrandom() call per row.
        prefix = os.urandom(6).hex()
        self._keys = (f"{prefix}-{n}" for n in itertools.count(1))
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._open_error: BaseException | None = None
        self._opened = False
        self._cycles = 0
        self._retry_at = 0.0
        self._failures = 0
        self._spool_failing = False
        self._spool_retry_at = 0.0
        self._dropped_said = (0, 0)
        self._dropped_said_at = -DROP_LOG_S
        self.rows_appended = 0
        self.rows_written = 0  # requests: a folded refusal row counts each request it stands for
        self.rows_scrubbed = 0  # written with values no column takes made safe (rejection.py)
        self.rows_rejected = 0  # refused by the database even scrubbed: in the log only
        self.rows_spooled = 0  # moved to the spool since start (written from it later)
        self.write_errors = 0
        self.spool_errors = 0
        self.up = True  # the last write (or open) reached the database
        self.oldest_pending_since: float | None = None  # wall time the oldest unwritten row waits since

    @property
    def location(self) -> str:
        return self.database.location

    @property
    def pending(self) -> int:
        """Rows held in memory, not yet in the database or the spool."""
        return len(self._unwritten) + len(self._batch) + len(self._refused_batch) + len(self.refused)

    @property
    def spooled(self) -> int:
        """Rows in the spool file now (the spool's depth)."""
        return 0 if self.spool is None else self.spool.depth

    @property
    def rows_dropped_billable(self) -> int:
        return self._unwritten.dropped

    @property
    def rows_dropped(self) -> int:
        return self.rows_dropped_billable + self.refused.dropped

    def append(self, row: LedgerRow) -> None:
        self.rows_appended += 1
        if row.status == "refused":
            self.refused.add(row)  # bounded apart: a flood of refusals never evicts a billable row
            return
        unwritten = self._unwritten
        unwritten.add(row)
        if len(unwritten) >= self._batch_size:
            self._wake.set()

    def append_probe(self, row: LedgerRow) -> None:
        """A synthetic probe's row (the ``probes`` table), written with the next batch; not counted
        among the request rows, and dropped rather than retried when the database refuses it."""
        self._probes.append(row)

    async def start(self) -> None:
        """Open (create, migrate) the database in the writer thread; raise here if it cannot be."""
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._started.wait)
        if self._open_error is not None:
            self._thread = None
            raise RuntimeError(str(self._open_error))

    async def close(self) -> None:
        """Write every row held (or spool it while the database is away), then stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake.set()
        await joined(thread, "ledger-close")
        self._thread = None

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the rows appended so far are in the database (spooled ones too); False if that
        took over ``timeout_s``."""
        cycles = self._cycles
        for _ in range(max(1, int(timeout_s / 0.01))):
            if self._thread is None:
                return True
            # Two cycles ended: one of them began after this call, so it saw every row appended.
            if self._cycles >= cycles + 2 and not self.pending and not self.spooled:
                return True
            self._wake.set()
            await asyncio.sleep(0.01)
        return False

    def _run(self) -> None:
        try:
            self._open()
        except LedgerUnavailable as exc:
            # A fleet's database away at a replica's start (both restarting, say) must not keep the
            # replica down too: with a spool to hold its rows, it serves and opens the database later.
            if not (self.database.shared and self.spool is not None):
                self._open_error = exc
                self._started.set()
                return
            log.error("%s; serving without it: rows go to the spool until it answers", exc)
            self.up = False
        self._started.set()
        try:
            self._count_spool()
            busy = self.spooled > 0  # a spool a previous run left is written at once
            while not self._stopping:
                if not busy:  # a part batch waits for the interval (or for a full one)
                    self._wake.wait(self._flush_interval_s)
                    self._wake.clear()
                busy = self._cycle()
                self._cycles += 1
            self._drain_at_close()
        finally:
            self.database.close()
            if self.spool is not None:
                self.spool.close()

    def _open(self) -> None:
        applied = self.database.open()
        shared = " (shared by the fleet)" if self.database.shared else ""
        log.info("ledger: %s%s; migrations applied: %s", self.location, shared, applied or "none")
        self._opened = True

    def _opened_now(self) -> bool:
        """Whether the database is open, opening it (and migrating) if the start could not."""
        if not self._opened:
            with contextlib.suppress(LedgerUnavailable):
                self._open()
        return self._opened

    def _count_spool(self) -> None:
        """How many rows the spool holds (a previous run's, or another process's sharing the folder)."""
        try:
            if self.spool is not None and self.spool.count():
                log.warning("ledger spool %s holds %d rows: writing them", self.spool.path, self.spool.depth)
        except LedgerUnavailable as exc:
            log.error("%s; rows will wait in memory while the database is away", exc)

    def _cycle(self) -> bool:
        """One turn of the writer; True when there is more to do at once (spool rows to write)."""
        self._say_dropped()
        self.refused.lines.summarize(refusal_log)
        if not self.up:
            self._spool_held()  # first, so a write that hangs holds only the rows that come meanwhile
            if time.monotonic() < self._retry_at:
                return False
        if self._opened_now() and self._write_held() and self._replay_spool() and self._reached():
            self._failures = 0
            if not self.pending and not self.spooled:
                self.oldest_pending_since = None
            return self.spooled > 0 and time.monotonic() >= self._spool_retry_at
        self._failures += 1
        self._retry_at = time.monotonic() + min(RETRY_MAX_S, 0.1 * 2**self._failures)
        self._spool_held()
        return False

    def _reached(self) -> bool:
        """Whether the database answers, asked only while it is thought away and this cycle wrote nothing
        (another replica sharing the spool wrote its rows, and no new ones came): else ``up`` would
        stay false until the next request."""
        if self.up:
            return True
        try:
            with self.database.reading() as reader:
                reader.query("SELECT 1")
        except LedgerUnavailable:
            return False
        self.up = True
        log.warning("ledger %s is back", self.location)
        return True

    def _keyed(self, rows: list[LedgerRow]) -> list[Keyed]:
        keyed = []
        for row in rows:
            safe = scrubbed(row)
            self.rows_scrubbed += safe is not None
            keyed.append((*(safe or row), next(self._keys)))
        return keyed

    def _write_held(self) -> bool:
        """Write what memory holds, batch by batch; False when the database refused one (it stays)."""
        if self._probes:
            probes = self._keyed([self._probes.popleft() for _ in range(len(self._probes))])
            try:
                self.database.write(probes)
            except LedgerUnavailable as exc:
                log.warning("%s; %d probe rows dropped", exc, len(probes))
        if not self._refused_batch and len(self.refused):
            self._refused_batch = self._keyed(self.refused.take())
        if self._refused_batch and not self._write(self._refused_batch):
            return False
        self._refused_batch = []
        unwritten = self._unwritten
        while self._batch or unwritten:
            if not self._batch:
                self._batch = self._keyed(unwritten.take(self._batch_size))
            if not self._write(self._batch):
                return False
            self._batch = []
        return True

    def _write(self, rows: list[Keyed]) -> bool:
        try:
            rejected = write_apart(self.database.write, rows)
        except LedgerUnavailable as exc:
            self.write_errors += 1
            if self.oldest_pending_since is None:
                self.oldest_pending_since = rows[0][0]
            if self.up:
                log.error("%s; rows are kept (in the spool while it takes them) and retried", exc)
            self.up = False
            return False
        if not self.up:
            self.up = True
            self._count_spool()  # with the rows other processes sharing the spool left there
            log.warning("ledger %s is back: writing the rows kept meanwhile", self.location)
        for row in rejected:  # written nowhere else: the log keeps it whole
            log.error("ledger: the database refused this row even scrubbed, so it is left out: %r", row)
        self.rows_rejected += len(rejected)
        self.rows_written += sum(row[COUNT_INDEX] for row in rows) - sum(row[COUNT_INDEX] for row in rejected)
        return True

    def _replay_spool(self) -> bool:
        """Write the spool's oldest rows (a few batches a cycle); False when the database refused."""
        spool = self.spool
        if spool is None or not spool.depth or time.monotonic() < self._spool_retry_at:
            return True
        try:
            for _ in range(REPLAY_BATCHES_PER_CYCLE):
                rows = [upgraded(row) for row in spool.oldest(self._batch_size)]
                if not rows:
                    spool.count()  # another process may have written some: the file's count, again
                    return True
                if not self._write(rows):
                    return False
                spool.remove(rows)  # if this fails, the rows are written again: their keys are skipped
        except LedgerUnavailable as exc:
            self.spool_errors += 1
            self._spool_retry_at = time.monotonic() + RETRY_MAX_S
            log.error("%s; its rows wait there", exc)
        return True

    def _spool_held(self) -> None:
        """Move every row memory holds to the spool (the database is away); keep them when it fails."""
        spool = self.spool
        if spool is None:
            return
        if not self._refused_batch and len(self.refused):
            self._refused_batch = self._keyed(self.refused.take())
        fresh = self._unwritten.oldest()  # they stay waiting until the spool has them
        rows = self._batch + self._refused_batch + self._keyed(fresh)
        if not rows:
            return
        try:
            spool.add(rows)
        except LedgerUnavailable as exc:
            self.spool_errors += 1
            self._unwritten.not_moved()  # they still wait (keyed again later)
            if not self._spool_failing:
                log.error("%s; rows wait in memory (billable: at most %d)", exc, self._unwritten.max_rows)
            self._spool_failing = True
            return
        if self._spool_failing:
            log.warning("ledger spool %s takes rows again", spool.path)
        self._spool_failing = False
        self._unwritten.moved()
        self.rows_spooled += len(rows)
        self._batch, self._refused_batch = [], []

    def _say_dropped(self) -> None:
        """A log line when rows were dropped since the last one (at most one every DROP_LOG_S)."""
        dropped = (self.rows_dropped_billable, self.refused.dropped)
        if dropped == self._dropped_said or time.monotonic() < self._dropped_said_at + DROP_LOG_S:
            return
        billable, refused = dropped[0] - self._dropped_said[0], dropped[1] - self._dropped_said[1]
        log.error(
            "ledger: rows dropped, neither the database nor the spool taking them: %d billable (memory"
            " bound %d rows), %d refused-request rows (their own bound); totals %d and %d",
            billable,
            self._unwritten.max_rows,
            refused,
            *dropped,
        )
        self._dropped_said, self._dropped_said_at = dropped, time.monotonic()

    def _drain_at_close(self) -> None:
        """Write what memory holds; while the database is away spool it at once, and only when the
        spool fails too, keep retrying the database up to ``close_timeout_s``."""
        self.refused.lines.summarize(refusal_log, everything=True)
        if self.up and self._write_held():
            return
        self._spool_held()
        deadline = time.monotonic() + self._close_timeout_s
        delay = 0.1
        while self.pending and not self._write_held() and time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(RETRY_MAX_S, delay * 2)
        self._say_dropped()
        if self.pending:
            log.error("ledger closed with %d rows unwritten (see the errors above)", self.pending)
        elif self.spooled:
            log.warning("ledger %s away at close: %d rows wait in the spool", self.location, self.spooled)
