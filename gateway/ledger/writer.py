"""The ledger writer: rows appended in O(1) on the request path, written in batches by one background
thread to whichever database holds the ledger. While the database is away the rows wait in a bounded
buffer and the batch is retried with backoff; ``close()`` writes what is left (a SIGTERM loses
nothing), and rows a shared database still refuses at the close go to a local spill file that the
next start replays. A SIGKILL loses the rows not yet written: at most one flush interval's worth, or
the whole backlog while the database is away.
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
from gateway.ledger.opening import open_database
from gateway.ledger.rows import COLUMNS, LedgerRow
from gateway.ledger.sqlite import SqliteLedger

log = logging.getLogger("gateway.ledger")

# Bounded so a ledger that cannot write costs memory up to a limit (~100 MB), then drops the oldest.
MAX_PENDING_ROWS = 200_000
RETRY_MAX_S = 5.0
STREAM_INDEX = COLUMNS.index("stream")
PROBE_INDEX = COLUMNS.index("probe")


class Ledger:
    """Collects rows from the event loop and writes them from one thread, in batches.

    ``append`` only puts a tuple on a deque (thread-safe in CPython) and, when a batch is full, wakes
    the writer; every other ``flush_interval_s`` the writer takes whatever is there.
    """

    def __init__(
        self,
        database: LedgerDatabase | Path | str,
        *,
        flush_interval_s: float = 1.0,
        batch_size: int = 500,
        close_timeout_s: float = 20.0,
        spill_path: Path | None = None,
    ) -> None:
        self.database = open_database(database) if isinstance(database, str | Path) else database
        self.path = self.database.path if isinstance(self.database, SqliteLedger) else None
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._close_timeout_s = close_timeout_s
        self._spill_path = spill_path if self.database.shared else None
        self._pending: deque[LedgerRow] = deque()
        self._probes: deque[LedgerRow] = deque(maxlen=10_000)  # synthetic probes, apart
        # Being written now, with each row's key: kept and retried as is when a write fails.
        self._batch: list[tuple[Any, ...]] = []
        # Random once per writer, then counted: unique across replicas and restarts without a
        # getrandom() call per row.
        prefix = os.urandom(6).hex()
        self._keys = (f"{prefix}-{n}" for n in itertools.count(1))
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._open_error: BaseException | None = None
        self.rows_appended = 0
        self.rows_written = 0
        self.rows_dropped = 0
        self.rows_spilled = 0
        self.write_errors = 0
        self.up = True  # the last write (or open) reached the database
        self.oldest_pending_since: float | None = None  # wall time the oldest unwritten row waits since

    @property
    def location(self) -> str:
        return self.database.location

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._batch)

    def append(self, row: LedgerRow) -> None:
        pending = self._pending
        if len(pending) >= MAX_PENDING_ROWS:
            pending.popleft()
            self.rows_dropped += 1
        pending.append(row)
        self.rows_appended += 1
        if len(pending) >= self._batch_size:
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
        """Write every pending row (retrying up to ``close_timeout_s``), then stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake.set()
        # Joined in a daemon thread of its own, not the loop's executor: a stop that gives up on a writer
        # stuck in its database (gateway.stopping) must leave no thread the interpreter's exit waits on.
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ended.done():
                ended.set_result(None)

        def join() -> None:
            thread.join()
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(wake)

        threading.Thread(target=join, name="ledger-close", daemon=True).start()
        await ended
        self._thread = None

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the rows appended so far are written; False if that took over ``timeout_s``."""
        target = self.rows_appended
        for _ in range(max(1, int(timeout_s / 0.01))):
            if self._thread is None or self.rows_written + self.rows_dropped >= target:
                return True
            self._wake.set()
            await asyncio.sleep(0.01)
        return False

    def _run(self) -> None:
        try:
            applied = self.database.open()
            shared = " (shared by the fleet)" if self.database.shared else ""
            log.info("ledger: %s%s; migrations applied: %s", self.location, shared, applied or "none")
            self._replay_spill()
        except LedgerUnavailable as exc:
            self._open_error = exc
            self._started.set()
            return
        self._started.set()
        try:
            failures = 0
            while not self._stopping:
                # After a failure, wait longer each time (up to RETRY_MAX_S) before trying again.
                wait = self._flush_interval_s if not failures else min(RETRY_MAX_S, 0.1 * 2**failures)
                self._wake.wait(wait)
                self._wake.clear()
                failures = 0 if self._write_pending() else failures + 1
            self._drain_at_close()
        finally:
            self.database.close()

    def _write_pending(self) -> bool:
        """Write batches until none is left; False when the database refused one (it stays queued)."""
        if self._probes:
            probes = [(*self._probes.popleft(), next(self._keys)) for _ in range(len(self._probes))]
            try:
                self.database.write(probes)
            except LedgerUnavailable as exc:
                log.warning("%s; %d probe rows dropped", exc, len(probes))
        pending = self._pending
        while self._batch or pending:
            if not self._batch:
                taken = [pending.popleft() for _ in range(min(self._batch_size, len(pending)))]
                self._batch = [(*row, next(self._keys)) for row in taken]
            if self.oldest_pending_since is None:
                self.oldest_pending_since = self._batch[0][0]
            try:
                self.database.write(self._batch)
            except LedgerUnavailable as exc:
                self.write_errors += 1
                if self.up:
                    log.error("%s; %d rows wait and are retried", exc, self.pending)
                self.up = False
                return False
            if not self.up:
                log.warning("ledger %s is back: writing %d waiting rows", self.location, self.pending)
            self.up = True
            self.rows_written += len(self._batch)
            self._batch = []
            self.oldest_pending_since = pending[0].time if pending else None
        return True

    def _drain_at_close(self) -> None:
        deadline = time.monotonic() + self._close_timeout_s
        delay = 0.1
        while not self._write_pending() and time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(RETRY_MAX_S, delay * 2)
        if self.pending and self._spill_path is not None:
            self._spill(self._spill_path)
        if self.pending:
            log.error("ledger closed with %d rows unwritten (see the errors above)", self.pending)

    def _spill(self, path: Path) -> None:
        """Keep the rows the shared ledger refused in a local SQLite file (same schema, same keys)."""
        rows = self._batch + [(*row, next(self._keys)) for row in self._pending]
        spill = SqliteLedger(path)
        try:
            spill.open()
            spill.write(rows)
        except LedgerUnavailable:
            log.exception("could not spill %d ledger rows to %s", len(rows), path)
            return
        finally:
            spill.close()
        log.warning("ledger %s unreachable at close: %d rows kept in %s", self.location, len(rows), path)
        self.rows_spilled += len(rows)
        self._batch = []
        self._pending.clear()

    def _replay_spill(self) -> None:
        """Write the rows a previous run spilled (their keys make this safe to repeat), then drop them."""
        path = self._spill_path
        if path is None or not path.is_file():
            return
        with SqliteLedger(path).reading() as reader:
            query = f"SELECT {', '.join(COLUMNS)} FROM requests ORDER BY id"
            rows = [list(row) for row in reader.conn.execute(query).fetchall()]
        for row in rows:
            row[STREAM_INDEX] = bool(row[STREAM_INDEX])
            row[PROBE_INDEX] = bool(row[PROBE_INDEX])  # SQLite keeps booleans as integers
        for start in range(0, len(rows), self._batch_size):
            self.database.write([tuple(r) for r in rows[start : start + self._batch_size]])
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        log.warning("ledger: replayed %d spilled rows from %s into %s", len(rows), path, self.location)
